"""PAPA: microsoft/deberta-base on cola (the paper's recipe; see configs/base.py).

  python launch/main.py --config=configs/deberta_cola.py --workdir=workdirs/deberta_cola
"""

from configs import base


def get_config():
  return base.papa_config("deberta", "cola")
