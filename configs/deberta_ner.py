"""PAPA: microsoft/deberta-base on ner (the paper's recipe; see configs/base.py).

  python launch/main.py --config=configs/deberta_ner.py --workdir=workdirs/deberta_ner
"""

from configs import base


def get_config():
  return base.papa_config("deberta", "ner")
