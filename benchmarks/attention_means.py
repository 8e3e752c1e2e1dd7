"""Attention-means pass: Flax vs Hugging Face PyTorch, throughput and peak memory.

  python benchmarks/attention_means.py [--lengths 64,128 --batch 32]

The pass is a forward with every attention map plus the masked accumulation
`S += sum_b A_b * m_i m_j`, `N += sum_b m_i m_j` into float64 totals (what
PAPA's averaging script does, `output_attentions=True` with eager attention).
Models: all-MiniLM-L6-v2 (real weights) and a randomly initialised
BERT-base-sized checkpoint, both read from the same files by both sides.
Each (implementation, model, length) runs in a fresh child process, so its
peak resident memory (ru_maxrss, as /usr/bin/time -v reports) is its own;
the parent prints examples/s and the ratios. CPU float32.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import common  # noqa: E402
MINILM = "sentence-transformers/all-MiniLM-L6-v2"


def _batches(vocab: int, batch: int, length: int, count: int, seed: int = 0):
  import numpy as np
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(count):
    lengths = rng.integers(max(2, length // 4), length + 1, size=batch)
    mask = (np.arange(length)[None] < lengths[:, None]).astype(np.int32)
    ids = np.where(mask == 1, rng.integers(1000, vocab, (batch, length)), 0).astype(np.int32)
    out.append(dict(input_ids=ids, attention_mask=mask, token_type_ids=np.zeros_like(ids),
                    valid=np.ones(batch, bool)))
  return out


def child_flax(model_dir: str, batch: int, length: int, count: int, repeats: int) -> dict:
  import numpy as np
  from papa_jax import convert, parallel
  from papa_jax.papa import means
  model = convert.load_pretrained(model_dir)
  batches = _batches(model.config.vocab_size, batch, length, count)
  data = {k: np.concatenate([b[k] for b in batches]) for k in
          ("input_ids", "attention_mask", "token_type_ids")}
  mesh = parallel.make_mesh(1)

  def one_pass():
    return means.accumulate(model.config, model.params, data, mesh, batch_size=batch)

  return dict(seconds=common.median_seconds(one_pass, repeats, warmup=1))


def child_torch(model_dir: str, batch: int, length: int, count: int, repeats: int) -> dict:
  import torch
  from transformers import AutoModel
  torch.set_num_threads(os.cpu_count() or 1)
  model = AutoModel.from_pretrained(model_dir, attn_implementation="eager").eval()
  cfg = model.config
  data = [{k: torch.tensor(v, dtype=torch.long) for k, v in b.items() if k != "valid"}
          for b in _batches(cfg.vocab_size, batch, length, count)]

  def one_pass():
    sums = torch.zeros(cfg.num_hidden_layers, cfg.num_attention_heads, length, length,
                       dtype=torch.float64)
    counts = torch.zeros(length, length, dtype=torch.float64)
    with torch.inference_mode():
      for b in data:
        out = model(**b, output_attentions=True)
        m = b["attention_mask"].float()
        pair = m[:, :, None] * m[:, None, :]
        for layer, a in enumerate(out.attentions):
          sums[layer] += torch.einsum("bhqk,bqk->hqk", a, pair).double()
        counts += pair.sum(0).double()
    return sums, counts

  return dict(seconds=common.median_seconds(one_pass, repeats, warmup=1))


def make_bert_base(path: str) -> None:
  import torch
  from transformers import BertConfig, BertModel
  torch.manual_seed(0)
  BertModel(BertConfig()).save_pretrained(path)  # BERT-base defaults.


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--lengths", default="64,128")
  ap.add_argument("--batch", type=int, default=32)
  ap.add_argument("--batches", type=int, default=4, help="batches per timed pass")
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--models", default="minilm,bert-base")
  ap.add_argument("--child", default="")
  ap.add_argument("--model-dir", default="")
  ap.add_argument("--length", type=int, default=0)
  ap.add_argument("--json", default="")
  args = ap.parse_args()
  if args.child:
    fn = child_flax if args.child == "flax" else child_torch
    res = fn(args.model_dir, args.batch, args.length, args.batches, args.repeats)
    res["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(res))
    return

  from papa_jax import convert
  tmp = tempfile.mkdtemp()
  dirs = {}
  for m in args.models.split(","):
    if m == "minilm":
      dirs[m] = convert.resolve_model_dir(MINILM)
    else:
      dirs[m] = os.path.join(tmp, "bert-base")
      subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {ROOT!r}); "
                      f"from benchmarks.attention_means import make_bert_base; "
                      f"make_bert_base({dirs[m]!r})"], check=True, capture_output=True)
  rows = []
  for m, d in dirs.items():
    for length in map(int, args.lengths.split(",")):
      res = {}
      for impl in ("torch", "flax"):
        out = subprocess.run([sys.executable, __file__, "--child", impl, "--model-dir", d,
                              "--length", str(length), "--batch", str(args.batch),
                              "--batches", str(args.batches), "--repeats", str(args.repeats)],
                             capture_output=True, text=True, env=dict(os.environ, XLA_FLAGS=""))
        line = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
        if not line:
          raise RuntimeError(f"{impl} child failed:\n{out.stderr[-3000:]}")
        res[impl] = json.loads(line[0][7:])
      n = args.batch * args.batches
      rows.append(dict(
          model=m, length=length,
          hf_examples_per_s=n / res["torch"]["seconds"],
          flax_examples_per_s=n / res["flax"]["seconds"],
          speedup=res["torch"]["seconds"] / res["flax"]["seconds"],
          hf_peak_rss_mb=res["torch"]["peak_rss_mb"],
          flax_peak_rss_mb=res["flax"]["peak_rss_mb"],
          memory_ratio=res["flax"]["peak_rss_mb"] / res["torch"]["peak_rss_mb"]))
      print(rows[-1], flush=True)
  common.report(f"Attention-means pass, batch {args.batch}, CPU f32 (each side in its own "
                "process)", rows, args.json or None)


if __name__ == "__main__":
  common.tune_cpu()  # The launcher's XLA-CPU settings, before JAX starts.
  main()
