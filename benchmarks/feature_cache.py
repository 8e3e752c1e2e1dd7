"""End-to-end 15-epoch probe run on the quickstart task: cached features vs not.

  python benchmarks/feature_cache.py [--static-heads 0]

Both runs are the pipeline's own probing run (`papa.probe.probe_runs`: checkpoints,
per-epoch evaluation, feature caching when on) on configs/quickstart.py, with the same seed, a
deterministic encoder and bfloat16 features; only probe.cache_features
differs. Prints wall time, the speedup and both runs' scores.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import logging  # noqa: E402

from benchmarks import common  # noqa: E402
from configs import quickstart  # noqa: E402
from papa_jax.papa import probe  # noqa: E402
from papa_jax.stage import Setup  # noqa: E402


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--epochs", type=int, default=15)
  ap.add_argument("--max-train-examples", type=int, default=-1, help="-1: the quickstart's")
  ap.add_argument("--json", default="")
  args = ap.parse_args()
  logging.set_verbosity(logging.WARNING)
  rows = []
  for cache in (True, False):
    cfg = quickstart.get_config()
    cfg.probe.epochs = args.epochs
    cfg.probe.cache_features = cache
    if args.max_train_examples > 0:
      cfg.data.max_train_examples = args.max_train_examples
    setup = Setup(cfg, tempfile.mkdtemp(), inputs=("train", "eval"))
    _ = setup.train_data, setup.eval_data  # Tokenization is common to both; not timed.
    t = time.perf_counter()
    row = probe.probe_runs(setup, "raw", "lambda", 0, None, {})[0]
    seconds = time.perf_counter() - t
    rows.append(dict(run="cached" if cache else "uncached", seconds=seconds,
                     final_accuracy=row["score"], best_accuracy=row["best_score"],
                     train_examples=row["examples"], epochs=row["epochs"]))
    print(rows[-1], flush=True)
  for r in rows:
    r["speedup"] = rows[1]["seconds"] / r["seconds"]
  common.report(f"{args.epochs}-epoch probe run on the quickstart task (MiniLM, SST-2, "
                f"{rows[0]['train_examples']} train examples), cached vs uncached", rows,
                args.json or None)


if __name__ == "__main__":
  common.tune_cpu()  # The launcher's XLA-CPU settings, before JAX starts.
  main()
