"""What PAPA's controls add to the means pass: the raw pass with and without its extra sums.

  python benchmarks/means_extras.py [--examples 512 --length 64 --batch 32]

The raw means pass also sums `A^2`, `A log A` and each real query's row (the
entropy, variance and KL orderings' inputs, `papa/means.py` EXTRAS). This times
the pass as it runs (`AttentionSums("raw")`) against the same pass summing only
`A` (what it did before the controls), round-robin in one process, on real
all-MiniLM-L6-v2 weights and sentences of random lengths; CPU float32.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import papa_jax as pj  # noqa: E402
from benchmarks import common  # noqa: E402
from papa_jax import parallel, runner  # noqa: E402
from papa_jax.papa import means  # noqa: E402

MINILM = "sentence-transformers/all-MiniLM-L6-v2"


class AttentionOnly(means.AttentionSums):
  """The raw pass before the controls: only the masked sum of A."""

  def __call__(self, outs, batch, mask, params):
    return {"attention": super().__call__(outs, batch, mask, params)["attention"]}


def main(argv=None):
  ap = argparse.ArgumentParser()
  ap.add_argument("--examples", type=int, default=512)
  ap.add_argument("--length", type=int, default=64)
  ap.add_argument("--batch", type=int, default=32)
  ap.add_argument("--rounds", type=int, default=5)
  ap.add_argument("--json", default="")
  args = ap.parse_args(argv)
  common.tune_cpu()
  model = pj.load_pretrained(MINILM)
  rng = np.random.default_rng(0)
  n, length = args.examples, args.length
  lengths = rng.integers(length // 4, length + 1, n)
  mask = (np.arange(length)[None] < lengths[:, None]).astype(np.int32)
  ids = np.where(mask > 0, rng.integers(1000, 20000, (n, length)), 0).astype(np.int32)
  data = dict(input_ids=ids, attention_mask=mask, token_type_ids=np.zeros_like(ids))
  mesh = parallel.make_mesh(1)

  def timed(stat):
    return lambda: runner.sum_pass(stat, stat.capture, model.config, (model.params,), data,
                                   mesh, batch_size=args.batch)

  med, ratio = common.interleaved({"with_extras": timed(means.AttentionSums("raw")),
                                   "attention_only": timed(AttentionOnly("raw"))},
                                  rounds=args.rounds, warmup=1)
  rows = [dict(examples=n, length=length, with_extras_s=med["with_extras"],
               attention_only_s=med["attention_only"],
               ratio=ratio("with_extras", "attention_only"))]
  common.report("Means pass with the controls' extra sums vs without", rows, args.json or None)
  return rows


if __name__ == "__main__":
  main()
