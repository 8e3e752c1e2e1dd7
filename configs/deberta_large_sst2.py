"""PAPA: microsoft/deberta-large on sst2 (the paper's recipe; see configs/base.py).

  python launch/main.py --config=configs/deberta_large_sst2.py --workdir=workdirs/deberta_large_sst2
"""

from configs import base


def get_config():
  return base.papa_config("deberta_large", "sst2")
