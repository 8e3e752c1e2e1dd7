"""PAPA: roberta-large on qnli (the paper's recipe; see configs/base.py).

  python launch/main.py --config=configs/roberta_large_qnli.py --workdir=workdirs/roberta_large_qnli
"""

from configs import base


def get_config():
  return base.papa_config("roberta_large", "qnli")
