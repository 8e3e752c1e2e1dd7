"""Probe seeds trained together (`fitting.fit_many`) vs one after the other (`fitting.fit`).

  python benchmarks/probe_group.py [--examples 4000] [--epochs 2] [--seeds 3] [--rounds 2]

Cached bfloat16 features of the quickstart's shape (MiniLM: 7 hidden states x 64 tokens x
384), random values (the cost does not depend on them), the paper's probe and optimiser,
batch 16, on a one-device mesh. Each round times P sequential fits and one fit of the P
together, alternating; wall and process CPU seconds, compilation included (each sequential
fit compiles its own step, as the probe stage does).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
from ml_collections import ConfigDict  # noqa: E402

from benchmarks import common  # noqa: E402
from papa_jax import parallel
from papa_jax.probing import features, fitting, probes, train  # noqa: E402
from papa_jax.models.config import EncoderConfig  # noqa: E402

OPT = ConfigDict(dict(learning_rate=2e-5, adam_b1=0.9, adam_b2=0.999, adam_eps=1e-8,
                      weight_decay=0.0, grad_clip_norm=1.0))


def data(n: int, k: int = 7, length: int = 64, d: int = 384, seed: int = 0):
  rng = np.random.default_rng(seed)
  feats = rng.standard_normal((n, k, length, d), np.float32).astype(ml_dtypes.bfloat16)
  mask = (np.arange(length)[None] < rng.integers(5, length, n)[:, None]).astype(np.int32)
  return features.Features(feats, mask, rng.integers(0, 2, n).astype(np.int32))


def timed(fn) -> tuple[float, float]:
  t, c = time.perf_counter(), time.process_time()
  fn()
  return time.perf_counter() - t, time.process_time() - c


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--examples", type=int, default=4000)
  ap.add_argument("--eval-examples", type=int, default=872)
  ap.add_argument("--epochs", type=int, default=2)
  ap.add_argument("--seeds", type=int, default=3)
  ap.add_argument("--rounds", type=int, default=2)
  args = ap.parse_args()
  tr, ev = data(args.examples), data(args.eval_examples, seed=1)
  d = tr.features.shape[-1]
  enc = train.FrozenEncoder(None, None, EncoderConfig(
      vocab_size=8, hidden_size=d, num_layers=tr.features.shape[1] - 1, num_heads=12,
      intermediate_size=8, max_position_embeddings=tr.max_length))
  mesh = parallel.make_mesh(1)
  probe, tx = probes.make_probe("classification", 2, d, 0.1), train.make_optimizer(OPT)
  cfgs = [train.FitConfig(epochs=args.epochs, batch_size=16, eval_batch_size=64, seed=s,
                          log_every_steps=10**6) for s in range(42, 42 + args.seeds)]
  score = lambda logits: {}
  run = dict(
      in_turn=lambda: [fitting.fit("s", probe, enc, tx, c, tr, ev, score, mesh) for c in cfgs],
      together=lambda: fitting.fit_many("g", probe, enc, tx, cfgs, tr, ev, score, mesh))
  print(f"Load before: {os.getloadavg()}", flush=True)
  rows = []
  for r in range(args.rounds):
    times = {name: timed(fn) for name, fn in run.items()}
    (sw, sc), (gw, gc) = times["in_turn"], times["together"]
    rows.append(dict(round=r + 1, probes=args.seeds, steps=args.epochs * -(-args.examples // 16),
                     in_turn_wall_s=sw, in_turn_cpu_s=sc, together_wall_s=gw,
                     together_cpu_s=gc, wall_ratio=gw / sw, cpu_ratio=gc / sc))
    print(rows[-1], flush=True)
  print(f"Load after: {os.getloadavg()}", flush=True)
  common.report("Probe seeds together vs in turn", rows)


if __name__ == "__main__":
  main()
