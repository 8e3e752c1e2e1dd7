"""PAPA: roberta-large on sst2 (the paper's recipe; see configs/base.py).

  python launch/main.py --config=configs/roberta_large_sst2.py --workdir=workdirs/roberta_large_sst2
"""

from configs import base


def get_config():
  return base.papa_config("roberta_large", "sst2")
