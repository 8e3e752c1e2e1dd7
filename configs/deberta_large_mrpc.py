"""PAPA: microsoft/deberta-large on mrpc (the paper's recipe; see configs/base.py).

  python launch/main.py --config=configs/deberta_large_mrpc.py --workdir=workdirs/deberta_large_mrpc
"""

from configs import base


def get_config():
  return base.papa_config("deberta_large", "mrpc")
