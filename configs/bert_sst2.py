"""PAPA: bert-base-uncased on sst2 (the paper's recipe; see configs/papa.py).

  python launch/main.py --config=configs/bert_sst2.py --workdir=workdirs/bert_sst2

The same as --config=configs/papa.py:model=bert,task=sst2.
"""

from configs import base


def get_config():
  return base.papa_config("bert", "sst2")
