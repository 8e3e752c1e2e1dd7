"""Raw vs effective attention (Sun & Marasovic 2021) on a task's dev split.

  python launch/main.py --config=configs/effective.py:model=minilm,task=sst2 --workdir=DIR

model: minilm (all-MiniLM-L6-v2, packaged; SST-2 dev in a few CPU minutes),
bert (bert-base-uncased, Sun & Marasovic's setting), any key of configs/base.py's
MODELS, a hub id or a local directory. Inputs use the standard layout up to 128
tokens, so sentences longer than the head dimension keep all their tokens.
"""

from configs import base


def get_config(arg=None):
  a = base.parse_arg(arg, model="minilm", task="sst2")
  return base.effective_config(a.model, a.task)
