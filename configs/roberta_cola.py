"""PAPA: roberta-base on cola (the paper's recipe; see configs/base.py).

  python launch/main.py --config=configs/roberta_cola.py --workdir=workdirs/roberta_cola
"""

from configs import base


def get_config():
  return base.papa_config("roberta", "cola")
