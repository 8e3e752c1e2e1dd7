"""PAPA: roberta-base on ner (the paper's recipe; see configs/base.py).

  python launch/main.py --config=configs/roberta_ner.py --workdir=workdirs/roberta_ner
"""

from configs import base


def get_config():
  return base.papa_config("roberta", "ner")
