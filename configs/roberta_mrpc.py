"""PAPA: roberta-base on mrpc (the paper's recipe; see configs/base.py).

  python launch/main.py --config=configs/roberta_mrpc.py --workdir=workdirs/roberta_mrpc
"""

from configs import base


def get_config():
  return base.papa_config("roberta", "mrpc")
