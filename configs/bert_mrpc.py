"""PAPA: bert-base-uncased on mrpc (the paper's recipe; see configs/base.py).

  python launch/main.py --config=configs/bert_mrpc.py --workdir=workdirs/bert_mrpc
"""

from configs import base


def get_config():
  return base.papa_config("bert", "mrpc")
