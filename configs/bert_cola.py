"""PAPA: bert-base-uncased on cola (the paper's recipe; see configs/base.py).

  python launch/main.py --config=configs/bert_cola.py --workdir=workdirs/bert_cola
"""

from configs import base


def get_config():
  return base.papa_config("bert", "cola")
