"""Achieved FLOP/s of the encoder forward vs the machine's measured matmul peak.

  python benchmarks/flops.py [--batch 32 --length 128]

Peak: a jit-compiled 2048x2048 float32 matmul. Encoder: a randomly initialised
BERT-base-sized model (12 layers, hidden 768, 12 heads, FFN 3072); FLOPs from
XLA's cost analysis of the compiled forward. Both measured in this process.
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
from papa_jax.models.encoder import init_params  # noqa: E402

BERT_BASE = pj.EncoderConfig(vocab_size=30522, hidden_size=768, num_layers=12,
                             num_heads=12, intermediate_size=3072, max_position_embeddings=512)


def matmul_peak(n: int = 2048, repeats: int = 10) -> float:
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
  f = jax.jit(jnp.matmul)
  t = common.median_seconds(lambda: f(a, b).block_until_ready(), repeats)
  return 2 * n**3 / t


def encoder_flops(config, batch: int, length: int, repeats: int = 5) -> tuple[float, float]:
  params = init_params(config)
  rng = np.random.default_rng(0)
  ids = jnp.asarray(rng.integers(1000, 20000, (batch, length)), jnp.int32)
  mask = jnp.ones((batch, length), jnp.int32)
  enc = pj.Encoder(config)
  fwd = jax.jit(lambda p, i, m: enc.apply({"params": p}, i, m).hidden_states)
  flops = fwd.lower(params, ids, mask).compile().cost_analysis()["flops"]
  t = common.median_seconds(lambda: jax.block_until_ready(fwd(params, ids, mask)), repeats)
  return flops, t


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--batch", type=int, default=32)
  ap.add_argument("--length", type=int, default=128)
  ap.add_argument("--json", default="")
  args = ap.parse_args()
  peak = matmul_peak()
  flops, t = encoder_flops(BERT_BASE, args.batch, args.length)
  peak_after = matmul_peak()  # Bracket the run: this VM's speed drifts.
  peak = max(peak, peak_after)
  rows = [dict(what="jit matmul 2048^2 f32 (peak)", gflop_per_s=peak / 1e9, fraction=1.0),
          dict(what=f"BERT-base forward b{args.batch} L{args.length}",
               gflop_per_s=flops / t / 1e9, fraction=flops / t / peak)]
  common.report(f"Encoder FLOP/s vs matmul peak ({flops / 1e9:.0f} GFLOP per forward, "
                f"{t:.2f}s)", rows, args.json or None)


if __name__ == "__main__":
  common.tune_cpu()  # The launcher's XLA-CPU settings, before JAX starts.
  main()
