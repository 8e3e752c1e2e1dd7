"""PAPA: bert-base-uncased on ner (the paper's recipe; see configs/base.py).

  python launch/main.py --config=configs/bert_ner.py --workdir=workdirs/bert_ner
"""

from configs import base


def get_config():
  return base.papa_config("bert", "ner")
