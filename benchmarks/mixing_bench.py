"""Context-mixing measures: papa_jax (batched, jitted) vs the reference procedures in PyTorch.

  python benchmarks/mixing_bench.py [--batch 8 --length 128 --ref-sentences 2]

Real all-MiniLM-L6-v2 (6 layers, 12 heads, d 384, d_ff 1536), CPU float32,
sentences of `length` real tokens (random ids). Each (implementation, method)
runs in its own process, so its peak resident memory (`ru_maxrss`) is its own;
seconds are per sentence (medians of repeats). papa_jax runs `batch` sentences
per call through `papa_jax.context_mixing`; the reference
(`tests/mixing_reference.py`: one sentence at a time, the `[H, N, N, d]`
tensors materialised, value zeroing by re-running each layer once per token)
runs `ref-sentences`. "x forward" divides by one papa_jax forward pass of the
same batch (`Encoder.apply` with every hidden state), so it is the measure's
cost in forward-pass multiples, including that forward.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
OURS = {"forward": (), "norms": ("attn", "attnres", "attnresln", "globenc"),
        "alti": ("alti",), "value_zeroing": ("value_zeroing",)}


def _rss_mb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _inputs(batch: int, length: int):
  import numpy as np
  ids = np.random.default_rng(0).integers(1000, 20000, (batch, length)).astype(np.int32)
  ids[:, 0], ids[:, -1] = 101, 102  # [CLS] ... [SEP]
  return ids


def one(impl: str, method: str, batch: int, length: int, repeats: int) -> dict:
  """Times one (implementation, method) in this process."""
  import numpy as np
  if impl == "papa_jax":
    import jax

    import papa_jax as pj
    from papa_jax.data import preprocess
    model = pj.load_pretrained(MINILM)
    ids = _inputs(batch, length)
    mask = np.ones_like(ids)
    if method == "forward":
      enc = pj.Encoder(model.config)
      f = jax.jit(lambda p, i, m: enc.apply({"params": p}, i, m).hidden_states)
      run = lambda: jax.block_until_ready(f(model.params, ids, mask))
    else:
      data = preprocess.Encoded(ids, mask, np.zeros_like(ids), np.zeros(batch, np.int32))
      run = lambda: pj.context_mixing(model, data, methods=OURS[method], batch_size=batch,
                                      rollout=False)
    n = batch
  else:
    import torch

    from papa_jax import convert
    from tests import hf_oracle, mixing_reference as ref
    torch.set_num_threads(os.cpu_count() or 1)
    hf = hf_oracle.load_hf(convert.packaged_model_dir(MINILM))
    sents = _inputs(batch, length)
    fn = dict(norms=ref.norms, alti=ref.alti,
              value_zeroing=lambda m, i: ref.value_zeroing(m, i, double=False))[method]
    run = lambda: [fn(hf, s) for s in sents]
    n = batch
  before = _rss_mb()
  t0 = time.perf_counter()
  run()  # Warm-up (and compilation).
  first = time.perf_counter() - t0
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    run()
    times.append(time.perf_counter() - t)
  return dict(impl=impl, method=method, sentences=n, s_per_sentence=float(np.median(times)) / n,
              first_call_s=first, rss_before_mb=before, peak_rss_mb=_rss_mb())


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--length", type=int, default=128)
  ap.add_argument("--ref-sentences", type=int, default=2)
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--json", default="")
  ap.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.one:
    impl, method = args.one
    print(json.dumps(one(impl, method, args.batch, args.length, args.repeats)))
    return
  from benchmarks import common
  rows, ours = [], {}
  for method in OURS:
    for impl in ("papa_jax", "reference"):
      if impl == "reference" and method == "forward":
        continue
      b = args.batch if impl == "papa_jax" else args.ref_sentences
      reps = args.repeats if impl == "papa_jax" else 1
      r = common.child(__file__, "--one", impl, method, "--batch", str(b), "--length",
                       str(args.length), "--repeats", str(reps))
      print(r, flush=True)
      ours[(impl, method)] = r
  fwd = ours[("papa_jax", "forward")]["s_per_sentence"]
  for method in OURS:
    if method == "forward":
      continue
    a, b = ours[("papa_jax", method)], ours[("reference", method)]
    rows.append(dict(method=method, papa_jax_ms=1e3 * a["s_per_sentence"],
                     papa_jax_x_forward=a["s_per_sentence"] / fwd,
                     reference_ms=1e3 * b["s_per_sentence"],
                     reference_x_forward=b["s_per_sentence"] / fwd,
                     speedup=b["s_per_sentence"] / a["s_per_sentence"],
                     papa_jax_peak_mb=a["peak_rss_mb"], reference_peak_mb=b["peak_rss_mb"]))
  rows.insert(0, dict(method="forward", papa_jax_ms=1e3 * fwd, papa_jax_x_forward=1.0,
                      reference_ms=float("nan"), reference_x_forward=float("nan"),
                      speedup=float("nan"),
                      papa_jax_peak_mb=ours[("papa_jax", "forward")]["peak_rss_mb"],
                      reference_peak_mb=float("nan")))
  common.report(f"Context mixing, all-MiniLM-L6-v2, {args.length} tokens, papa_jax batch "
                f"{args.batch}, reference {args.ref_sentences} sentences one at a time", rows,
                args.json or None)


if __name__ == "__main__":
  main()
