"""PAPA: bert-large-uncased on mnli (the paper's recipe; see configs/base.py).

  python launch/main.py --config=configs/bert_large_mnli.py --workdir=workdirs/bert_large_mnli
"""

from configs import base


def get_config():
  return base.papa_config("bert_large", "mnli")
