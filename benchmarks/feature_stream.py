"""Probes trained from cached features in memory vs read per batch from their file.

  python benchmarks/feature_stream.py [--train 2000] [--eval 872] [--epochs 2]

Three SST-2-style probes trained together (`fitting.fit_many`, 3 seeds, batch 32) on
cached bfloat16 features of all-mpnet-base-v2's shape (13 hidden states x 64 positions x
768) with random values (the cost does not depend on them): held on the device (a
one-device CPU run: host memory), as a run keeps features under run.cache_memory_gb, or in
a `.npy` file read per batch (`features.Features.rows`), as a run does over it or with
run.cache_dir. Each side runs in its own process (its peak RSS its own); wall seconds per
epoch (training and the dev pass, after a first compiled epoch) and the dev logits compared.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from benchmarks import common  # noqa: E402

SHAPE = (13, 64, 768)  # all-mpnet-base-v2's hidden states x positions x width.


def _write(path: str, n: int, seed: int) -> None:
  """A `.npy` of `n` random bfloat16 feature rows, written in chunks (little memory)."""
  import ml_dtypes  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(seed)
  mm = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint16, shape=(n, *SHAPE))
  del mm
  from papa_jax.probing import features  # pylint: disable=import-outside-toplevel
  offset = features._data_offset(path)  # pylint: disable=protected-access
  with open(path, "r+b") as f:
    f.seek(offset)
    for start in range(0, n, 64):
      rows = rng.standard_normal((min(64, n - start), *SHAPE), np.float32)
      f.write(rows.astype(ml_dtypes.bfloat16).view(np.uint8))


def side(mode: str, folder: str, n_train: int, n_eval: int, epochs: int) -> dict:
  """One side's run in this process: seconds per epoch after the first, peak RSS, logits."""
  common.tune_cpu()
  import jax  # pylint: disable=import-outside-toplevel
  from papa_jax import parallel  # pylint: disable=import-outside-toplevel
  from papa_jax.models.config import EncoderConfig  # pylint: disable=import-outside-toplevel
  from papa_jax.probing import features, fitting, probes, train  # pylint: disable=import-outside-toplevel
  from tests.testing import optimizer_config  # pylint: disable=import-outside-toplevel
  splits = []
  for name, n in (("train", n_train), ("eval", n_eval)):
    path = os.path.join(folder, f"{name}.npy")
    labels = np.random.default_rng(n).integers(0, 2, n).astype(np.int32)
    mask = np.ones((n, SHAPE[1]), np.int32)
    f = features.Features(None, mask, labels, path, features._data_offset(path))  # pylint: disable=protected-access
    f.features = np.load(path, mmap_mode="r").view(jax.numpy.bfloat16)
    if mode == "memory":  # As `features.compute` leaves them: a device array.
      rows = parallel.Rows(n, SHAPE, jax.numpy.bfloat16, parallel.make_mesh(1))
      for start in range(0, n, 256):
        rows.add(f.rows(np.arange(start, min(n, start + 256)))["features"])
      f = features.Features(rows.data, mask, labels)
    splits.append(f)
  mesh = parallel.make_mesh(1)
  config = EncoderConfig(vocab_size=30527, hidden_size=SHAPE[2], num_layers=SHAPE[0] - 1,
                         num_heads=12, intermediate_size=3072, max_position_embeddings=514)
  encoder = train.FrozenEncoder({}, None, config, feature_dtype="bfloat16")
  probe = probes.SentenceProbe(2, SHAPE[2], 0.1)
  times = []

  def score(logits):
    times.append(time.perf_counter())
    return {"accuracy": float((logits.argmax(-1) == splits[1].labels).mean())}

  cfgs = [train.FitConfig(epochs=epochs, batch_size=32, eval_batch_size=64, seed=s)
          for s in (42, 43, 44)]
  t0 = time.perf_counter()
  out = fitting.fit_many("bench", probe, encoder, train.make_optimizer(optimizer_config()),
                         cfgs, splits[0], splits[1], score, mesh)
  per_epoch = [b - a for a, b in zip([t0] + times[::3], times[::3])]
  return dict(mode=mode, first_epoch_s=per_epoch[0],
              epoch_s=float(np.median(per_epoch[1:])) if epochs > 1 else float("nan"),
              peak_rss_gib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
              logits_sum=float(sum(np.abs(o[2]).sum() for o in out)))


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--train", type=int, default=2000)
  ap.add_argument("--eval", type=int, default=872)
  ap.add_argument("--epochs", type=int, default=2)
  ap.add_argument("--side", default="", help="internal: run one side here")
  ap.add_argument("--folder", default="")
  args = ap.parse_args()
  if args.side:
    import json  # pylint: disable=import-outside-toplevel
    print(json.dumps(side(args.side, args.folder, args.train, args.eval, args.epochs)))
    return
  print(common.machine_line(common.machine()), flush=True)
  print(f"Load before: {os.getloadavg()}", flush=True)
  with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as folder:
    _write(os.path.join(folder, "train.npy"), args.train, 0)
    _write(os.path.join(folder, "eval.npy"), args.eval, 1)
    rows = [common.child(__file__, "--side", mode, "--folder", folder, "--train",
                         str(args.train), "--eval", str(args.eval), "--epochs", str(args.epochs))
            for mode in ("memory", "file")]
  rows[1]["slowdown"] = rows[1]["epoch_s"] / rows[0]["epoch_s"]
  rows[0]["slowdown"] = 1.0
  common.report(f"3 probes trained together on {args.train} cached mpnet-shaped feature rows "
                f"(13 x 64 x 768 bfloat16, {args.eval} dev rows), in memory vs read per batch",
                rows)
  print(f"Load after: {os.getloadavg()}", flush=True)
  if rows[0]["logits_sum"] != rows[1]["logits_sum"]:
    sys.exit("The two sides' dev logits differ.")


if __name__ == "__main__":
  main()
