"""Raw vs effective attention of bert-base-uncased on SST-2 dev (as Sun & Marasovic).

  python launch/main.py --config=configs/bert_effective_sst2.py --workdir=workdirs/bert_eff

Standard layout, 128 tokens (the reference setting). Needs bert-base-uncased
from the hub or a local directory (--config.model.name=/path/to/bert).
"""

from configs import base


def get_config():
  return base.effective_config("bert-base-uncased", "sst2")
