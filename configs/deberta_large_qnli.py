"""PAPA: microsoft/deberta-large on qnli (the paper's recipe; see configs/base.py).

  python launch/main.py --config=configs/deberta_large_qnli.py --workdir=workdirs/deberta_large_qnli
"""

from configs import base


def get_config():
  return base.papa_config("deberta_large", "qnli")
