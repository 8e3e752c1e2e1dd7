"""Raw vs effective attention of bert-base-uncased on SST-2 dev (as Sun & Marasovic).

  python launch/main.py --config=configs/bert_effective_sst2.py --workdir=workdirs/bert_eff

Standard layout, 128 tokens (the reference setting). Needs bert-base-uncased
from the hub or a local directory (--config.model.name=/path/to/bert).
"""

from configs import base


def get_config():
  c = base.get_config()
  c.stage = "effective"
  c.model.name = "bert-base-uncased"
  c.data.task = "sst2"
  c.data.max_length = 128
  c.data.papa_layout = False
  c.effective.split = "validation"
  return c
