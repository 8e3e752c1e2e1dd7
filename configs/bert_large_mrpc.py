"""PAPA: bert-large-uncased on mrpc (the paper's recipe; see configs/base.py).

  python launch/main.py --config=configs/bert_large_mrpc.py --workdir=workdirs/bert_large_mrpc
"""

from configs import base


def get_config():
  return base.papa_config("bert_large", "mrpc")
