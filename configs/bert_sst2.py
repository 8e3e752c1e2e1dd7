"""PAPA: bert-base-uncased on sst2 (the paper's recipe; see configs/base.py).

  python launch/main.py --config=configs/bert_sst2.py --workdir=workdirs/bert_sst2
"""

from configs import base


def get_config():
  return base.papa_config("bert", "sst2")
