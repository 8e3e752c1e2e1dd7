"""PAPA: microsoft/deberta-base on mnli (the paper's recipe; see configs/base.py).

  python launch/main.py --config=configs/deberta_mnli.py --workdir=workdirs/deberta_mnli
"""

from configs import base


def get_config():
  return base.papa_config("deberta", "mnli")
