"""One probe training step: Flax (dynamic, all heads constant) vs a PyTorch reference.

  python benchmarks/probe_step.py [--batch 16]

Implementations are timed round-robin (`common.interleaved`); ratios are
medians of per-round ratios. A step = frozen encoder forward (all hidden states, no
dropout) + PAPA pooler and classifier forward/backward + gradient clipping + AdamW update. The
PyTorch reference runs the same probe on the Hugging Face model with the
encoder under torch.no_grad() (what the original code's frozen backbone
amounts to, minus its dropout). Same real weights, same batch, one process.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from ml_collections import ConfigDict  # noqa: E402

import papa_jax as pj  # noqa: E402
from benchmarks import common  # noqa: E402
from papa_jax.probing import probes, train  # noqa: E402

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
OPT = ConfigDict(dict(learning_rate=2e-5, adam_b1=0.9, adam_b2=0.999, adam_eps=1e-8,
                      weight_decay=0.0, grad_clip_norm=1.0))


def torch_step_fn(model_dir: str, batch: dict, num_labels: int = 2):
  import torch
  from torch import nn
  from transformers import AutoModel
  common.set_torch_threads()
  enc = AutoModel.from_pretrained(model_dir, attn_implementation="eager").eval()
  cfg = enc.config
  K, L, D = cfg.num_hidden_layers + 1, batch["input_ids"].shape[1], cfg.hidden_size

  class Probe(nn.Module):
    def __init__(self):
      super().__init__()
      self.w = nn.Parameter(torch.full((K, L), 1.0 / L))
      self.dense = nn.Linear(K * D, D)
      self.drop = nn.Dropout(0.1)
      self.cls = nn.Linear(D, num_labels)

    def forward(self, hidden, mask):
      v = torch.einsum("bkld,kl,bl->bkd", hidden, self.w, mask)
      return self.cls(self.drop(torch.tanh(self.dense(v.flatten(1)))))

  probe = Probe()
  opt = torch.optim.AdamW(probe.parameters(), lr=2e-5, weight_decay=0.0)
  t = {k: torch.tensor(v, dtype=torch.long) for k, v in batch.items()
       if k in ("input_ids", "attention_mask", "token_type_ids")}
  labels = torch.tensor(batch["labels"], dtype=torch.long)

  def step():
    with torch.no_grad():
      hidden = torch.stack(enc(**t, output_hidden_states=True).hidden_states, 1)
    loss = nn.functional.cross_entropy(probe(hidden, t["attention_mask"].float()), labels)
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(probe.parameters(), 1.0)
    opt.step()
    return loss.item()

  return step


def flax_step_fn(model: pj.Pretrained, batch: dict, static: bool):
  cfg = model.config
  L = batch["input_ids"].shape[1]
  override = None
  if static:
    override = pj.AttentionOverride.constant(
        jnp.full((cfg.num_layers, cfg.num_heads, L, L), 1.0 / L))
  encoder = train.FrozenEncoder(model.params, override, cfg)
  probe = probes.SentenceProbe(2, cfg.hidden_size, 0.1)
  tx = train.make_optimizer(OPT)
  state = train.init_state(probe, encoder, tx, 0, L)
  step = jax.jit(train.make_train_step(probe, tx, 0), donate_argnums=0)
  b = jax.device_put(batch)
  holder = [state]

  def run():
    holder[0], loss = step(holder[0], b, encoder)
    return float(loss)

  return run


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--batch", type=int, default=16)
  ap.add_argument("--repeats", type=int, default=15)
  ap.add_argument("--models", default="minilm:64,bert-base:128")
  ap.add_argument("--json", default="")
  args = ap.parse_args()
  tmp = tempfile.mkdtemp()
  for spec_ in args.models.split(","):
    name, length = spec_.split(":")
    length = int(length)
    if name == "minilm":
      model = pj.load_pretrained(MINILM)
    else:
      from benchmarks.attention_means import make_bert_base
      make_bert_base(os.path.join(tmp, "bert-base"))
      model = pj.load_pretrained(os.path.join(tmp, "bert-base"))
    rng = np.random.default_rng(0)
    lengths = rng.integers(length // 4, length + 1, args.batch)
    mask = (np.arange(length)[None] < lengths[:, None]).astype(np.int32)
    ids = np.where(mask == 1, rng.integers(1000, 20000, (args.batch, length)), 0).astype(np.int32)
    batch = dict(input_ids=ids, attention_mask=mask, token_type_ids=np.zeros_like(ids),
                 labels=rng.integers(0, 2, args.batch).astype(np.int32),
                 valid=np.ones(args.batch, bool))
    med, ratio = common.interleaved(dict(
        torch=torch_step_fn(model.model_dir, batch), dynamic=flax_step_fn(model, batch, False),
        static=flax_step_fn(model, batch, True)), args.repeats)
    b = args.batch
    rows = [dict(impl="PyTorch (HF encoder under no_grad)", examples_per_s=b / med["torch"],
                 vs_pytorch=1.0, vs_flax_dynamic=1 / ratio("torch", "dynamic")),
            dict(impl="Flax, dynamic attention", examples_per_s=b / med["dynamic"],
                 vs_pytorch=ratio("torch", "dynamic"), vs_flax_dynamic=1.0),
            dict(impl="Flax, all heads constant", examples_per_s=b / med["static"],
                 vs_pytorch=ratio("torch", "static"), vs_flax_dynamic=ratio("dynamic", "static"))]
    common.report(f"Probe training step, {name}, batch {b}, length {length}, CPU f32", rows,
                  args.json or None)


if __name__ == "__main__":
  common.tune_cpu()  # The launcher's XLA-CPU settings, before JAX starts.
  main()
