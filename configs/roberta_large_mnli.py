"""PAPA: roberta-large on mnli (the paper's recipe; see configs/base.py).

  python launch/main.py --config=configs/roberta_large_mnli.py --workdir=workdirs/roberta_large_mnli
"""

from configs import base


def get_config():
  return base.papa_config("roberta_large", "mnli")
