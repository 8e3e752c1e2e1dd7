"""Effective-attention analyses (Sun & Marasovic 2021) on a task's dev split.

  python launch/main.py --config=configs/effective.py:model=minilm,task=sst2 --workdir=DIR
  python launch/main.py --config=configs/effective.py:stage=finetune,other=minilm_sre --workdir=DIR
  python launch/main.py --config=configs/effective.py:stage=linguistic,task=pos --workdir=DIR
  python launch/main.py --config=configs/effective.py:stage=mixing,model=minilm,task=sst2 \
      --workdir=DIR

stage: effective (raw vs effective attention: mass per token class, divergence,
correlation, null-space norm), finetune (`model` vs its fine-tune `other`:
cosine and JS per head), linguistic (attention to part-of-speech classes; a
tagging task with gold POS: pos or udpos), mixing (context mixing beyond
attention: norms, rollout, ALTI, GlobEnc, value zeroing; papa_jax/measures/mixing.py;
--config.mixing.methods chooses). model/other: minilm
(all-MiniLM-L6-v2, packaged), minilm_sre (its fine-tune in the
sre-embedding-model package), bert (Sun & Marasovic's setting), any key of
configs/base.py's MODELS, a hub id or a directory. Inputs use the standard
layout up to 128 tokens (64 for tagged sentences: `Task.default_max_length`), so
sentences longer than the head dimension keep all their tokens. For head ablation see
configs/quickstart.py (stage=ablation runs on a PAPA workdir: it needs its
constant matrices, and compares with its head ranking).
"""

from configs import base


def get_config(arg=None):
  a = base.parse_arg(arg, stage="effective", model="minilm", task="sst2", other="minilm_sre")
  c = base.effective_config(a.model, a.task)
  c.stage = a.stage
  if a.stage == "finetune":
    c.finetune.other_model = base.model_name(a.other)
  return c
