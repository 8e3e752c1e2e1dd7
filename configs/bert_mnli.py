"""PAPA: bert-base-uncased on mnli (the paper's recipe; see configs/base.py).

  python launch/main.py --config=configs/bert_mnli.py --workdir=workdirs/bert_mnli
"""

from configs import base


def get_config():
  return base.papa_config("bert", "mnli")
