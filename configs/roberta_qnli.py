"""PAPA: roberta-base on qnli (the paper's recipe; see configs/base.py).

  python launch/main.py --config=configs/roberta_qnli.py --workdir=workdirs/roberta_qnli
"""

from configs import base


def get_config():
  return base.papa_config("roberta", "qnli")
