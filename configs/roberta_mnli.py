"""PAPA: roberta-base on mnli (the paper's recipe; see configs/base.py).

  python launch/main.py --config=configs/roberta_mnli.py --workdir=workdirs/roberta_mnli
"""

from configs import base


def get_config():
  return base.papa_config("roberta", "mnli")
