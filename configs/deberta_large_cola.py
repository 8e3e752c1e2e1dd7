"""PAPA: microsoft/deberta-large on cola (the paper's recipe; see configs/base.py).

  python launch/main.py --config=configs/deberta_large_cola.py --workdir=workdirs/deberta_large_cola
"""

from configs import base


def get_config():
  return base.papa_config("deberta_large", "cola")
