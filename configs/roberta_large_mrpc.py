"""PAPA: roberta-large on mrpc (the paper's recipe; see configs/base.py).

  python launch/main.py --config=configs/roberta_large_mrpc.py --workdir=workdirs/roberta_large_mrpc
"""

from configs import base


def get_config():
  return base.papa_config("roberta_large", "mrpc")
