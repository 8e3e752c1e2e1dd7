"""Attribution patching at 512 tokens on a BERT-base-sized model: time and peak memory, papa-jax
against TransformerLens, in one command.

  python benchmarks/atp_long.py [--n 8 --length 512]      (needs the `bench` extra)

The model is a seeded random `BertForPreTraining` of BERT-base's shape (12 layers, 768 wide, 12
heads, 30,522 tokens; random weights: the cost does not depend on them), converted to
papa-jax and to TransformerLens 3.9's `HookedEncoder` (checked equal to Hugging Face first).
Data: `n` seeded random token sequences of `length` tokens ([CLS] ... [SEP], no padding),
each corrupt one with 16 seeded positions replaced. Metric: the MLM head's logit difference
of two fixed tokens at [CLS]. AtP of the residual stream entering every layer (every
position) and of every head's output (every position), one forward and one backward pass,
as in patching_bench.py; each side in its own process, timed after one warm-up call, with
its peak RSS.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import patching_bench  # pylint: disable=wrong-import-position

TOKENS = (2204, 2919)  # Two fixed vocabulary ids ("good", "bad" in BERT's vocabulary).


def save_model(path: str) -> None:
  """A seeded random BERT-base `BertForPreTraining` (MLM head and pooler), as safetensors."""
  import torch
  import transformers as tr
  torch.manual_seed(0)
  tr.BertForPreTraining(tr.BertConfig()).eval().save_pretrained(path, safe_serialization=True)


def pairs(n: int, length: int):
  rng = np.random.default_rng(0)
  clean = rng.integers(1000, 30000, (n, length))
  clean[:, 0], clean[:, -1] = 101, 102
  corrupt = clean.copy()
  for row in corrupt:
    row[rng.choice(np.arange(1, length - 1), 16, replace=False)] = rng.integers(1000, 30000, 16)
  return clean, corrupt


def ours(path: str, clean, corrupt):
  import papa_jax as pj
  from papa_jax.causal import metrics
  m = pj.load_pretrained(path)
  metric = metrics.logit_difference(metrics.mlm_head(m), *TOKENS)
  batch = lambda ids: dict(input_ids=ids.astype(np.int32),
                           attention_mask=np.ones_like(ids, np.int32))
  layers, heads, L = m.config.num_layers, m.config.num_heads, clean.shape[1]
  targets = {"residual_in": pj.Targets.grid(layers, positions=range(L)),
             "context": pj.Targets.grid(layers, positions=range(L), heads=range(heads))}
  return lambda: np.concatenate([v.sum(1) for v in pj.attribution_patch(
      m, batch(corrupt), batch(clean), targets, metric).values()])


def tl(path: str, clean, corrupt):
  import torch
  import transformers as tr
  torch.set_num_threads(os.cpu_count() or 1)
  # TL maps the pooler too: hence BertForPreTraining.
  model, mlm = patching_bench.tl_model(tr.BertForPreTraining.from_pretrained(path).eval())
  cfg = model.cfg
  clean_t, corrupt_t = torch.tensor(clean[:1]), torch.tensor(corrupt[:1])
  with torch.no_grad():
    gap = (model.encoder_output(clean_t) - mlm.bert(clean_t).last_hidden_state).abs().max()
  assert gap < 1e-3, gap
  clean_t, corrupt_t = torch.tensor(clean), torch.tensor(corrupt)
  a, b = TOKENS
  layers = cfg.n_layers

  def atp():
    from transformer_lens import utils
    names = lambda n: n.endswith("hook_resid_pre") or n.endswith("hook_z")
    acts, grads = {}, {}
    with torch.no_grad():
      _, clean_cache = model.run_with_cache(clean_t, names_filter=names)
    model.reset_hooks()
    model.add_hook(names, lambda x, hook: acts.__setitem__(hook.name, x.detach()), "fwd")
    model.add_hook(names, lambda x, hook: grads.__setitem__(hook.name, x.detach()), "bwd")
    logits = model(corrupt_t)
    (logits[:, 0, a] - logits[:, 0, b]).sum().backward()
    model.reset_hooks()
    est = lambda name, l, dims: ((clean_cache[utils.get_act_name(name, l)]
                                  - acts[utils.get_act_name(name, l)])
                                 * grads[utils.get_act_name(name, l)]).sum(dims)
    resid = torch.stack([est("resid_pre", l, (0, 2)) for l in range(layers)])
    z = torch.stack([est("z", l, (0, 3)) for l in range(layers)])
    return np.concatenate([resid.reshape(-1).numpy(), z.reshape(-1).numpy()])
  return atp


def one(impl: str, path: str, n: int, length: int, out_path: str) -> dict:
  clean, corrupt = pairs(n, length)
  run = (ours if impl == "papa_jax" else tl)(path, clean, corrupt)
  t0 = time.perf_counter()
  run()
  first = time.perf_counter() - t0
  c, t = time.process_time(), time.perf_counter()
  result = np.asarray(run(), np.float64)
  wall, cpu = time.perf_counter() - t, time.process_time() - c
  np.save(out_path, result)
  return dict(impl=impl, examples=n, length=length, first_call_s=first, wall_s=wall, cpu_s=cpu,
              peak_rss_mb=patching_bench._rss_mb())  # pylint: disable=protected-access


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--n", type=int, default=8)
  ap.add_argument("--length", type=int, default=512)
  ap.add_argument("--impls", default="papa_jax,tl")
  ap.add_argument("--json", default="")
  ap.add_argument("--one", nargs=3, help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.one:
    import json
    impl, path, out = args.one
    print(json.dumps(one(impl, path, args.n, args.length, out)))
    return
  from benchmarks import common
  tmp = tempfile.mkdtemp()
  save_model(tmp)
  results, values = {}, {}
  for impl in args.impls.split(","):
    out = os.path.join(tmp, f"{impl}.npy")
    results[impl] = common.child(__file__, "--one", impl, tmp, out, "--n", str(args.n),
                                 "--length", str(args.length))
    values[impl] = np.load(out)
    print(results[impl], flush=True)
  rows = [dict(r, max_abs_diff=float(np.abs(values[k] - values["papa_jax"]).max()),
               scale=float(np.abs(values["papa_jax"]).max())) for k, r in results.items()]
  common.report(f"AtP of every (layer, position) and (layer, position, head), random BERT-base "
                f"shape, {args.n} x {args.length} tokens", rows, args.json or None)


if __name__ == "__main__":
  main()
