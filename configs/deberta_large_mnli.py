"""PAPA: microsoft/deberta-large on mnli (the paper's recipe; see configs/base.py).

  python launch/main.py --config=configs/deberta_large_mnli.py --workdir=workdirs/deberta_large_mnli
"""

from configs import base


def get_config():
  return base.papa_config("deberta_large", "mnli")
