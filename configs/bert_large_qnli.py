"""PAPA: bert-large-uncased on qnli (the paper's recipe; see configs/base.py).

  python launch/main.py --config=configs/bert_large_qnli.py --workdir=workdirs/bert_large_qnli
"""

from configs import base


def get_config():
  return base.papa_config("bert_large", "qnli")
