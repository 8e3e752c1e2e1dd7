"""Encoder forward throughput: Flax vs Hugging Face PyTorch, fast path vs dynamic.

  python benchmarks/encoder_throughput.py [--batch 32 --length 128]

Same real model (all-MiniLM-L6-v2), same batch, one process, CPU float32.
Both sides return every hidden state; "+attn" also returns every attention map
(HF with eager attention). Prints examples/s and ratios; implementations are
timed round-robin and ratios are medians of per-round ratios.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import papa_jax as pj  # noqa: E402
from benchmarks import common  # noqa: E402

MINILM = "sentence-transformers/all-MiniLM-L6-v2"


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--batch", type=int, default=32)
  ap.add_argument("--length", type=int, default=128)
  ap.add_argument("--repeats", type=int, default=7)
  ap.add_argument("--json", default="")
  args = ap.parse_args()
  b, l = args.batch, args.length

  model = pj.load_pretrained(MINILM)
  cfg = model.config
  rng = np.random.default_rng(0)
  lengths = rng.integers(l // 4, l + 1, size=b)
  mask = (np.arange(l)[None] < lengths[:, None]).astype(np.int32)
  ids = np.where(mask == 1, rng.integers(1000, 20000, (b, l)), 0).astype(np.int32)

  enc = pj.Encoder(cfg)

  @jax.jit
  def flax_fwd(params, ids, mask):
    return enc.apply({"params": params}, ids, mask).hidden_states

  @jax.jit
  def flax_fwd_attn(params, ids, mask):
    out = enc.apply({"params": params}, ids, mask, capture_attention=True)
    return out.hidden_states, out.attentions

  constants = jnp.full((cfg.num_layers, cfg.num_heads, l, l), 1.0 / l)
  ov = pj.AttentionOverride(constants=constants,
                            static_heads=np.ones((cfg.num_layers, cfg.num_heads), bool))

  @jax.jit
  def flax_static(params, ids, mask, ov):
    return enc.apply({"params": params}, ids, mask, override=ov).hidden_states

  jids, jmask = jnp.asarray(ids), jnp.asarray(mask)
  block = jax.block_until_ready

  import torch  # pylint: disable=import-outside-toplevel
  from transformers import BertModel  # pylint: disable=import-outside-toplevel
  common.set_torch_threads()
  hf = BertModel.from_pretrained(model.model_dir, attn_implementation="eager").eval()
  tids, tmask = torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.long)

  def torch_fwd(attn):
    with torch.inference_mode():
      return hf(input_ids=tids, attention_mask=tmask, output_hidden_states=True,
                output_attentions=attn)

  med, ratio = common.interleaved(dict(
      torch=lambda: torch_fwd(False), torch_attn=lambda: torch_fwd(True),
      flax=lambda: block(flax_fwd(model.params, jids, jmask)),
      flax_attn=lambda: block(flax_fwd_attn(model.params, jids, jmask)),
      static=lambda: block(flax_static(model.params, jids, jmask, ov))), args.repeats)
  rows = [
      dict(impl="HF PyTorch eager", examples_per_s=b / med["torch"], ratio_vs_hf=1.0),
      dict(impl="Flax", examples_per_s=b / med["flax"], ratio_vs_hf=ratio("torch", "flax")),
      dict(impl="HF PyTorch eager +attn", examples_per_s=b / med["torch_attn"], ratio_vs_hf=1.0),
      dict(impl="Flax +attn", examples_per_s=b / med["flax_attn"],
           ratio_vs_hf=ratio("torch_attn", "flax_attn")),
      dict(impl="Flax all heads constant (fast path)", examples_per_s=b / med["static"],
           ratio_vs_hf=ratio("torch", "static")),
  ]
  t_ratio = ratio("flax", "static")
  common.report(f"Encoder forward, MiniLM-L6, batch {b}, length {l}, CPU f32; "
                f"static/dynamic = {t_ratio:.2f}x", rows, args.json or None)


if __name__ == "__main__":
  common.tune_cpu()  # The launcher's XLA-CPU settings, before JAX starts.
  main()
