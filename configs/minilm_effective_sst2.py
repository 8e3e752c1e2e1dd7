"""Raw vs effective attention (Sun & Marasovic 2021) at quickstart size.

  python launch/main.py --config=configs/minilm_effective_sst2.py --workdir=workdirs/minilm_eff

all-MiniLM-L6-v2 on the SST-2 dev split (872 sentences) in a few CPU minutes.
Inputs use the standard layout (no PAPA layout) up to 128 tokens, so that
sentences longer than the head dimension (32) keep all their tokens.
"""

from configs import base


def get_config():
  c = base.effective_config("sentence-transformers/all-MiniLM-L6-v2", "sst2")
  c.effective.batch_size = 16
  return c
