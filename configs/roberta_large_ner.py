"""PAPA: roberta-large on ner (the paper's recipe; see configs/base.py).

  python launch/main.py --config=configs/roberta_large_ner.py --workdir=workdirs/roberta_large_ner
"""

from configs import base


def get_config():
  return base.papa_config("roberta_large", "ner")
