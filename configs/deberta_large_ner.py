"""PAPA: microsoft/deberta-large on ner (the paper's recipe; see configs/base.py).

  python launch/main.py --config=configs/deberta_large_ner.py --workdir=workdirs/deberta_large_ner
"""

from configs import base


def get_config():
  return base.papa_config("deberta_large", "ner")
