"""PAPA: microsoft/deberta-base on sst2 (the paper's recipe; see configs/base.py).

  python launch/main.py --config=configs/deberta_sst2.py --workdir=workdirs/deberta_sst2
"""

from configs import base


def get_config():
  return base.papa_config("deberta", "sst2")
