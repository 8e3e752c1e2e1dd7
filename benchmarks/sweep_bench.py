"""Head-ablation and attention-knockout sweeps on MiniLM: papa-jax against TransformerLens and
Hugging Face forward hooks, in one command.

  python benchmarks/sweep_bench.py [--n 256]      (needs the `bench` extra)

Data: the first `n` SST-2 dev sentences, padded to the longest (a mask on every side). Metric,
as in patching_bench.py: a seeded random MLM head's logit difference "good" - "bad" at [CLS]
(all-MiniLM-L6-v2 has none; `patching_bench.mlm_head`), averaged over the sentences per
target. Sweeps:
  heads:    every single-head ablation (72: a head's output, TransformerLens's `hook_z`,
            set to zero at every position);
  knockout: every (layer window, edge class) attention knockout (Geva et al. 2023): windows of
            one layer (6) x the knockout stage's classes (every query's edges to [CLS],
            separators, punctuation, all other tokens, the previous and the next token: 6),
            the blocked probabilities set to zero and each row renormalised over the rest (a
            -inf score before the softmax).
Implementations, each sweep in its own process (its peak RSS its own):
  papa_jax:   `pj.patch`'s sweep with a zero source at "context" (heads) and `pj.knockout`;
              timed on a second call (the first, compile included, is reported too);
  tl:         TransformerLens 3.9's `HookedEncoder` as its docs show: one `run_with_hooks`
              forward per head or (window, class) over the batch (`hook_z`, `hook_pattern`),
              the logits, then the metric;
  tl_batched: one forward per layer (heads) or window (knockout), its targets stacked on the
              batch axis, the metric read from the last residual without the vocabulary
              projection;
  hf:         Hugging Face `BertForPreTraining` (its default attention) with forward hooks,
              one forward per target: a pre-hook on the attention output projection zeroes the
              head's slice of its input; knockout adds -inf to the layer's attention mask at the
              blocked edges (a pre-hook on the self-attention);
  hf_batched: the same hooks over stacked targets, the metric from [CLS] alone.
Peers are timed on one call after a one-target warm-up. Every implementation's [targets]
vector is compared with papa-jax's (max |difference|, with the metric's scale).
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

MINILM = patching_bench.MINILM
IMPLS = ("papa_jax", "tl", "tl_batched", "hf", "hf_batched")
SWEEPS = ("heads", "knockout")
CHUNK_ROWS = 1536  # Rows per batched peer forward (targets x sentences), as papa-jax's chunks.


def data(n: int):
  """ids, mask `[n, L]` (padded to the longest), the knockout's blocked edges
  `[classes, n, L, L]`, its windows and the metric's two token ids."""
  import papa_jax as pj
  from papa_jax.analysis import knockout
  tok = pj.load_pretrained(MINILM).tokenizer()
  shared = os.environ.get("PAPA_SHARED", "../shared")
  with open(os.path.join(shared, "data", "sst2", "dev.tsv"), encoding="utf-8") as f:
    next(f)
    texts = [line.split("\t")[0] for line, _ in zip(f, range(n))]
  enc = tok(texts, padding="longest", return_tensors="np")
  ids, mask = enc["input_ids"].astype(np.int64), enc["attention_mask"].astype(np.int64)

  class Data:
    input_ids, attention_mask = ids, mask
  blocked = knockout.blocked_edges(Data, tok, knockout.CLASSES).transpose(1, 0, 2, 3)
  layers = pj.load_pretrained(MINILM).config.num_layers
  return ids, mask, blocked, knockout.windows(layers, 1), tuple(
      tok.convert_tokens_to_ids(["good", "bad"]))


def ours(sweep: str, ids, mask, blocked, windows, tokens):
  import papa_jax as pj
  from papa_jax.causal import knockout, patching
  m = pj.load_pretrained(MINILM)
  metric = patching_bench.mlm_metric(tokens, m.config.layer_norm_eps)
  batch = dict(input_ids=ids.astype(np.int32), attention_mask=mask.astype(np.int32))
  c = m.config
  if sweep == "heads":
    zeros = np.zeros((c.num_layers, len(ids), ids.shape[1], c.num_heads, c.dim_per_head),
                     np.float32)
    targets = pj.Targets.grid(c.num_layers, heads=range(c.num_heads))
    return lambda: patching.sweep(m, batch, zeros, "context", targets, metric,
                                  chunk=CHUNK_ROWS // len(ids)).mean(1)
  return lambda: knockout.sweep(m, batch, blocked, windows, metric,
                                chunk=CHUNK_ROWS // len(ids)).mean(-1).reshape(-1)


def _stacked(count: int, n: int) -> list[tuple[int, int]]:
  """(start, stop) target ranges of at most CHUNK_ROWS rows each."""
  per = max(1, CHUNK_ROWS // n)
  return [(s, min(s + per, count)) for s in range(0, count, per)]


def tl(sweep: str, ids, mask, blocked, windows, tokens, batched: bool):
  import torch
  model, mlm = patching_bench.tl_model()
  a, b = tokens
  ids_t, mask_t = torch.tensor(ids), torch.tensor(mask)
  with torch.no_grad():  # The peer equals Hugging Face before anything is timed.
    gap = ((model.encoder_output(ids_t, one_zero_attention_mask=mask_t)
            - mlm.bert(ids_t, attention_mask=mask_t).last_hidden_state)[mask_t.bool()]
           ).abs().max()
  assert gap < 1e-4, gap
  layers, heads, n = model.cfg.n_layers, model.cfg.n_heads, len(ids)
  blocked_t = torch.tensor(blocked)  # [C, n, L, L]
  classes = blocked.shape[0]

  def knock(pattern, cut):  # cut: [rows, L, L] bool.
    cut = cut[:, None]
    kept = pattern.masked_fill(cut, 0.0)
    return torch.where(cut.any(-1, keepdim=True), kept / kept.sum(-1, keepdim=True), pattern)

  if not batched:
    def run_one(target: int) -> float:
      if sweep == "heads":
        layer, head = divmod(target, heads)

        def hook(z, hook, head=head):
          z[:, :, head] = 0.0
          return z
        hooks = [(f"blocks.{layer}.attn.hook_z", hook)]
      else:
        w, k = divmod(target, classes)
        first, last = windows[w]
        hooks = [(f"blocks.{l}.attn.hook_pattern", lambda p, hook, k=k: knock(p, blocked_t[k]))
                 for l in range(first, last + 1)]
      with torch.no_grad():
        logits = model.run_with_hooks(ids_t, one_zero_attention_mask=mask_t, fwd_hooks=hooks)
      return float((logits[:, 0, a] - logits[:, 0, b]).mean())
    count = layers * heads if sweep == "heads" else len(windows) * classes
    return run_one, count

  head = mlm.cls.predictions
  w_ab = (head.decoder.weight[a] - head.decoder.weight[b]).detach()
  bias = float(head.bias[a] - head.bias[b])
  count = heads if sweep == "heads" else classes
  groups = layers if sweep == "heads" else len(windows)

  def run_group(g: int) -> np.ndarray:
    out = []
    for start, stop in _stacked(count, n):
      k = stop - start
      rows_ids, rows_mask = ids_t.repeat(k, 1), mask_t.repeat(k, 1)
      store = {}
      if sweep == "heads":
        def hook(z, hook, start=start, k=k):
          for j in range(k):
            z[j * n:(j + 1) * n, :, start + j] = 0.0
          return z
        hooks = [(f"blocks.{g}.attn.hook_z", hook)]
      else:
        cut = blocked_t[start:stop].reshape((k * n,) + blocked.shape[2:])
        first, last = windows[g]
        hooks = [(f"blocks.{l}.attn.hook_pattern", lambda p, hook, cut=cut: knock(p, cut))
                 for l in range(first, last + 1)]
      hooks.append((f"blocks.{layers - 1}.hook_normalized_resid_post",
                    lambda x, hook: store.__setitem__("r", x)))
      with torch.no_grad():
        model.run_with_hooks(rows_ids, one_zero_attention_mask=rows_mask, return_type=None,
                             fwd_hooks=hooks)
        out.append((head.transform(store["r"][:, 0]) @ w_ab + bias).reshape(k, n).mean(1))
    return torch.cat(out).numpy()
  return run_group, groups


def hf(sweep: str, ids, mask, blocked, windows, tokens, batched: bool):
  import torch
  mlm = patching_bench.mlm_head()
  a, b = tokens
  ids_t, mask_t = torch.tensor(ids), torch.tensor(mask)
  layer_mods = mlm.bert.encoder.layer
  layers = len(layer_mods)
  heads = mlm.config.num_attention_heads
  d = mlm.config.hidden_size // heads
  blocked_t = torch.tensor(blocked)
  classes, n = blocked.shape[0], len(ids)
  head = mlm.cls.predictions
  w_ab = (head.decoder.weight[a] - head.decoder.weight[b]).detach()
  bias = float(head.bias[a] - head.bias[b])

  def zero_heads(module, args, kwargs, rows_heads):
    x = args[0].clone()
    for rows, h in rows_heads:
      x[rows, :, h * d:(h + 1) * d] = 0.0
    return (x,) + args[1:], kwargs

  def cut_mask(module, args, kwargs, cut):  # cut: [rows, L, L] bool.
    m = kwargs.get("attention_mask")
    if m is None or m.dtype == torch.bool:
      keep = torch.ones(cut.shape, dtype=torch.bool) if m is None else m.expand(
          cut.shape[0], 1, *cut.shape[1:]).clone()
      kwargs["attention_mask"] = keep & ~cut[:, None]
    else:
      kwargs["attention_mask"] = m.expand(cut.shape[0], 1, *cut.shape[1:]).masked_fill(
          cut[:, None], torch.finfo(m.dtype).min)
    return args, kwargs

  def forward(rows_ids, rows_mask, hooks, full_logits: bool):
    handles = [mod.register_forward_pre_hook(fn, with_kwargs=True) for mod, fn in hooks]
    try:
      with torch.no_grad():
        if full_logits:  # As documented: the model's logits, then the metric.
          logits = mlm(input_ids=rows_ids, attention_mask=rows_mask).prediction_logits
          return logits[:, 0, a] - logits[:, 0, b]
        last = mlm.bert(input_ids=rows_ids, attention_mask=rows_mask).last_hidden_state
        return head.transform(last[:, 0]) @ w_ab + bias
    finally:
      for h in handles:
        h.remove()

  def hooks_for(group: int, start: int, stop: int, k: int):
    if sweep == "heads":
      rows_heads = [(slice(j * n, (j + 1) * n), start + j) for j in range(k)]
      return [(layer_mods[group].attention.output.dense,
               lambda mod, args, kw, rh=rows_heads: zero_heads(mod, args, kw, rh))]
    cut = blocked_t[start:stop].reshape((k * n,) + blocked.shape[2:])
    first, last = windows[group]
    return [(layer_mods[l].attention.self, lambda mod, args, kw, cut=cut: cut_mask(mod, args,
                                                                                   kw, cut))
            for l in range(first, last + 1)]

  count = heads if sweep == "heads" else classes
  groups = layers if sweep == "heads" else len(windows)
  if not batched:
    def run_one(target: int) -> float:
      g, j = divmod(target, count)
      return float(forward(ids_t, mask_t, hooks_for(g, j, j + 1, 1), True).mean())
    return run_one, groups * count

  def run_group(g: int) -> np.ndarray:
    out = []
    for start, stop in _stacked(count, n):
      k = stop - start
      vals = forward(ids_t.repeat(k, 1), mask_t.repeat(k, 1), hooks_for(g, start, stop, k),
                     False)
      out.append(vals.reshape(k, n).mean(1))
    return torch.cat(out).numpy()
  return run_group, groups


def one(impl: str, sweep: str, n: int, out_path: str) -> dict:
  import torch
  torch.set_num_threads(os.cpu_count() or 1)
  ids, mask, blocked, windows, tokens = data(n)
  if impl == "papa_jax":
    run = ours(sweep, ids, mask, blocked, windows, tokens)
    t0 = time.perf_counter()
    np.asarray(run())
    first = time.perf_counter() - t0
    c, t = time.process_time(), time.perf_counter()
    result = np.asarray(run(), np.float64)
  else:
    make = tl if impl.startswith("tl") else hf
    step, count = make(sweep, ids, mask, blocked, windows, tokens, impl.endswith("batched"))
    step(0)  # Warm-up: one target (or one group).
    first = float("nan")
    c, t = time.process_time(), time.perf_counter()
    result = np.concatenate([np.atleast_1d(np.asarray(step(i), np.float64))
                             for i in range(count)])
  wall, cpu = time.perf_counter() - t, time.process_time() - c
  np.save(out_path, result)
  return dict(impl=impl, sweep=sweep, examples=n, length=int(ids.shape[1]),
              targets=int(result.size), first_call_s=first, wall_s=wall, cpu_s=cpu,
              peak_rss_mb=patching_bench._rss_mb())  # pylint: disable=protected-access


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--n", type=int, default=256)
  ap.add_argument("--sweeps", default=",".join(SWEEPS))
  ap.add_argument("--impls", default=",".join(IMPLS))
  ap.add_argument("--json", default="")
  ap.add_argument("--one", nargs=3, help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.one:
    import json
    impl, sweep, path = args.one
    print(json.dumps(one(impl, sweep, args.n, path)))
    return
  from benchmarks import common
  tmp = tempfile.mkdtemp()
  results, values = {}, {}
  impls = args.impls.split(",")
  for sweep in args.sweeps.split(","):
    for impl in impls:
      path = os.path.join(tmp, f"{impl}_{sweep}.npy")
      results[(impl, sweep)] = common.child(__file__, "--one", impl, sweep, path, "--n",
                                            str(args.n))
      values[(impl, sweep)] = np.load(path)
      print(results[(impl, sweep)], flush=True)
  rows = []
  for sweep in args.sweeps.split(","):
    a = results[("papa_jax", sweep)]
    for peer in impls[1:]:
      b = results[(peer, sweep)]
      rows.append(dict(
          sweep=sweep, peer=peer, targets=a["targets"], papa_jax_s=a["wall_s"],
          peer_s=b["wall_s"], speedup=b["wall_s"] / a["wall_s"],
          speedup_with_compile=b["wall_s"] / a["first_call_s"], papa_jax_cpu_s=a["cpu_s"],
          peer_cpu_s=b["cpu_s"], examples_per_s=a["targets"] * args.n / a["wall_s"],
          peer_examples_per_s=b["targets"] * args.n / b["wall_s"],
          papa_jax_peak_mb=a["peak_rss_mb"], peer_peak_mb=b["peak_rss_mb"],
          max_abs_diff=float(np.abs(values[("papa_jax", sweep)] - values[(peer, sweep)]).max()),
          metric_scale=float(np.abs(values[("papa_jax", sweep)]).max())))
  length = results[("papa_jax", args.sweeps.split(",")[0])]["length"]
  common.report(f"Ablation and knockout sweeps, all-MiniLM-L6-v2, {args.n} SST-2 dev sentences "
                f"padded to {length} tokens (heads: 72 single-head ablations; knockout: 6 "
                f"one-layer windows x 6 edge classes)", rows, args.json or None)


if __name__ == "__main__":
  main()
