"""PAPA: microsoft/deberta-base on qnli (the paper's recipe; see configs/base.py).

  python launch/main.py --config=configs/deberta_qnli.py --workdir=workdirs/deberta_qnli
"""

from configs import base


def get_config():
  return base.papa_config("deberta", "qnli")
