"""A tagging probe's dev evaluation: batches cut to their scored positions vs full width.

  python benchmarks/tagging_eval.py [--examples 3250] [--states 13] [--hidden 768] [--rounds 5]

The dev pass `fitting.fit_many` makes after every epoch, for 3 probes trained together
(`fitting._group_predict`), on cached bfloat16 features of all-mpnet-base-v2's shape (13
hidden states x 64 positions x 768) with random values (the cost does not depend on them)
and the real CoNLL-2003 dev labels (the lengths that decide the cut: MiniLM's word pieces,
the PAPA layout, 64 positions). Rounds alternate the two; wall seconds per pass (compiled
before timing), and the logits at scored positions compared.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

import papa_jax as pj  # noqa: E402
from benchmarks import common  # noqa: E402
from papa_jax import shared
from papa_jax.probing import fitting, probes, train  # noqa: E402
from papa_jax.data import preprocess, readers, tasks  # noqa: E402

MINILM = "sentence-transformers/all-MiniLM-L6-v2"


def dev_labels(n: int) -> np.ndarray:
  task = tasks.get_task("ner")
  recs = list(readers.read_split(task, str(shared.data_dir("conll2003")), "validation"))[:n]
  return preprocess.encode(task, recs, pj.load_pretrained(MINILM).tokenizer(), 64).labels


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--examples", type=int, default=3250)
  ap.add_argument("--states", type=int, default=13)
  ap.add_argument("--hidden", type=int, default=768)
  ap.add_argument("--probes", type=int, default=3)
  ap.add_argument("--rounds", type=int, default=5)
  args = ap.parse_args()
  labels = dev_labels(args.examples)
  n, length = labels.shape
  rng = np.random.default_rng(0)
  table = dict(features=jax.numpy.asarray(rng.standard_normal(
      (n, args.states, length, args.hidden), np.float32).astype(ml_dtypes.bfloat16)),
      attention_mask=jax.numpy.asarray((labels != preprocess.IGNORE).astype(np.int32)),
      labels=jax.numpy.asarray(labels))
  probe = probes.TokenProbe(9, args.hidden)
  x = jax.numpy.zeros((1, args.states, length, args.hidden), jax.numpy.bfloat16)
  params = jax.tree.map(lambda *p: np.stack(p), *[
      {"probe": probe.init(jax.random.key(s), x, x[:, 0, :, 0])["params"]}
      for s in range(args.probes)])
  step = train.make_eval_step(probe)
  eval_fn = jax.jit(lambda p, b: jax.vmap(lambda q: step(q, b, None))(p))
  widths = fitting.scored_widths(labels)
  table = fitting.FeatureTable(table)
  passes = dict(full=lambda: fitting._group_predict(eval_fn, params, table, 32),
                cut=lambda: fitting._group_predict(eval_fn, params, table, 32, widths))
  keep = labels != preprocess.IGNORE
  out = {k: fn() for k, fn in passes.items()}  # Compiles every shape.
  same = all(np.array_equal(a[keep], b[keep]) for a, b in zip(out["full"], out["cut"]))
  print(common.machine_line(common.machine()), flush=True)
  print(f"Load before: {os.getloadavg()}", flush=True)
  med, ratio = common.interleaved(passes, rounds=args.rounds, warmup=0)
  print(f"Load after: {os.getloadavg()}", flush=True)
  common.report("Tagging probe dev pass, cut to scored positions vs full width", [dict(
      examples=n, positions=length, mean_width=float(widths.mean()),
      scored_per_row=float(keep.sum(1).mean()), probes=args.probes,
      full_s=med["full"], cut_s=med["cut"], cut_over_full=ratio("cut", "full"),
      logits_identical=same)])


if __name__ == "__main__":
  main()
