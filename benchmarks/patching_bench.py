"""Activation and attribution patching sweeps on MiniLM: papa-jax against TransformerLens.

  python benchmarks/patching_bench.py [--n 32 --length 24]      (needs the `bench` extra)

The peer is TransformerLens 3.9's `HookedEncoder` (version 4 removed it), built from
all-MiniLM-L6-v2's weights with a matching config and a seeded random MLM head (the checkpoint
has none; `BertForPreTraining` with the same seed gives both sides the same head); its encoder
output is first checked against Hugging Face's. Data: the first `n` SST-2 dev sentences with
at least `length` word pieces, cut to `length` (no padding, as TransformerLens's patching
helpers take no mask); each corrupt sentence has 3 seeded positions (not [CLS]/[SEP])
replaced by seeded vocabulary ids. Metric: the MLM head's logit difference "good" - "bad" at
[CLS], averaged over the sentences (TransformerLens's helpers return the batch mean).

Sweeps, each in its own process (its peak RSS its own), timed after one warm-up call:
  resid: every (layer, position) of the residual stream entering a layer (`resid_pre`);
  heads: every (layer, head) output at all positions (`hook_z`, our "context");
  atp:   attribution patching of both site families (one forward and one backward).
TransformerLens runs each as documented (`patching.get_act_patch_resid_pre`,
`get_act_patch_attn_head_out_all_pos`: one hooked forward per target over the batch; AtP as
in Nanda's attribution-patching notebook: a clean cache, a corrupt forward and backward with
gradient hooks) and in its best batched form (one forward per layer, its targets stacked on
the batch axis, the metric read from the last residual without the vocabulary projection).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
METHODS = {"papa_jax": ("base", "resid", "heads", "atp"), "tl": ("resid", "heads", "atp"),
           "tl_batched": ("resid", "heads")}


def _rss_mb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def pairs(n: int, length: int):
  """(clean, corrupt) token ids `[n, length]` and the metric's two token ids."""
  import papa_jax as pj
  tok = pj.load_pretrained(MINILM).tokenizer()
  shared = os.environ.get("PAPA_SHARED", "../shared")
  clean = []
  with open(os.path.join(shared, "data", "sst2", "dev.tsv"), encoding="utf-8") as f:
    next(f)
    for line in f:
      ids = tok(line.split("\t")[0])["input_ids"]
      if len(ids) >= length:
        clean.append(ids[:length - 1] + [tok.sep_token_id])
      if len(clean) == n:
        break
  clean = np.asarray(clean, np.int64)
  rng = np.random.default_rng(0)
  corrupt = clean.copy()
  for row in corrupt:
    row[rng.choice(np.arange(1, length - 1), 3, replace=False)] = rng.integers(1000, 30000, 3)
  return clean, corrupt, tuple(tok.convert_tokens_to_ids(["good", "bad"]))


def mlm_head():
  """A seeded `BertForPreTraining` with MiniLM's encoder weights (its MLM head random)."""
  import torch
  import transformers as tr
  from papa_jax import convert
  path = convert.packaged_model_dir(MINILM)
  torch.manual_seed(0)
  config = tr.BertConfig.from_pretrained(path)
  mlm = tr.BertForPreTraining(config).eval()  # Pooler and NSP head: TransformerLens maps them.
  base = tr.BertModel.from_pretrained(path).eval()
  missing = mlm.bert.load_state_dict(base.state_dict(), strict=False)
  assert not missing.missing_keys, missing
  return mlm.eval()


def mlm_metric(tokens, eps: float):
  """`metric(output, batch) -> [B]` for papa-jax: `mlm_head()`'s logit difference of the two
  `tokens` at [CLS] (its transform, GELU, LayerNorm and the two decoder rows), in jax."""
  import jax
  import jax.numpy as jnp
  head = mlm_head().cls.predictions
  a, b = tokens
  wt = jnp.asarray(head.transform.dense.weight.detach().numpy().T)
  bt = jnp.asarray(head.transform.dense.bias.detach().numpy())
  g, beta = (jnp.asarray(p.detach().numpy()) for p in (head.transform.LayerNorm.weight,
                                                       head.transform.LayerNorm.bias))
  dec = head.decoder.weight.detach().numpy()
  w = jnp.asarray(dec[a] - dec[b])
  bias = float(head.bias.detach().numpy()[a] - head.bias.detach().numpy()[b])

  def metric(out, batch):
    del batch
    t = jax.nn.gelu(out.hidden_states[-1][:, 0] @ wt + bt, approximate=False)
    mu, var = t.mean(-1, keepdims=True), t.var(-1, keepdims=True)
    return ((t - mu) / jnp.sqrt(var + eps) * g + beta) @ w + bias
  return metric


def ours(method: str, clean, corrupt, tokens):
  import papa_jax as pj
  m = pj.load_pretrained(MINILM)
  metric = mlm_metric(tokens, m.config.layer_norm_eps)
  L, layers, heads = clean.shape[1], m.config.num_layers, m.config.num_heads
  batch = lambda ids: dict(input_ids=ids.astype(np.int32), attention_mask=np.ones_like(
      ids, np.int32))
  resid = pj.Targets.grid(layers, positions=range(L))
  head_t = pj.Targets.grid(layers, heads=range(heads))
  if method == "resid":
    run = lambda: pj.patch(m, batch(corrupt), batch(clean), "residual_in", resid, metric,
                           chunk=32)["patched"].mean(1).reshape(layers, L)
  elif method == "heads":
    run = lambda: pj.patch(m, batch(corrupt), batch(clean), "context", head_t, metric,
                           chunk=24)["patched"].mean(1).reshape(layers, heads)
  elif method == "base":  # The corrupt run's metric: exact effects are patched - this.
    from papa_jax.causal import patching
    run = lambda: patching.run_metric(m, batch(corrupt), metric).mean(keepdims=True)
  else:
    run = lambda: np.concatenate([v.mean(1) for v in pj.attribution_patch(
        m, batch(corrupt), batch(clean), {"residual_in": resid, "context": head_t},
        metric).values()])
  return run


def tl_model(mlm=None):
  """TransformerLens 3.9's `HookedEncoder` with the weights of `mlm` (a `BertForPreTraining`;
  default `mlm_head()`), and `mlm`."""
  from transformer_lens import HookedEncoder, HookedTransformerConfig
  from transformer_lens.pretrained.weight_conversions import convert_bert_weights
  mlm = mlm_head() if mlm is None else mlm
  c = mlm.config
  cfg = HookedTransformerConfig(
      n_layers=c.num_hidden_layers, d_model=c.hidden_size, n_ctx=c.max_position_embeddings,
      d_head=c.hidden_size // c.num_attention_heads, n_heads=c.num_attention_heads,
      d_mlp=c.intermediate_size, d_vocab=c.vocab_size, act_fn="gelu", eps=c.layer_norm_eps,
      attention_dir="bidirectional", normalization_type="LN",
      original_architecture="BertForMaskedLM", device="cpu")
  model = HookedEncoder(cfg)
  model.load_state_dict(convert_bert_weights(mlm, cfg), strict=False)
  model.eval()
  return model, mlm


def tl(method: str, clean, corrupt, tokens, batched: bool):
  import torch
  from transformer_lens import patching, utils
  torch.set_num_threads(os.cpu_count() or 1)
  model, mlm = tl_model()
  a, b = tokens
  clean_t, corrupt_t = torch.tensor(clean), torch.tensor(corrupt)
  with torch.no_grad():  # The peer equals Hugging Face before anything is timed.
    gap = (model.encoder_output(clean_t) - mlm.bert(clean_t).last_hidden_state).abs().max()
  assert gap < 1e-4, gap
  metric = lambda logits: (logits[:, 0, a] - logits[:, 0, b]).mean()
  layers, heads, L = model.cfg.n_layers, model.cfg.n_heads, clean.shape[1]
  if not batched:
    with torch.no_grad():
      _, cache = model.run_with_cache(clean_t)
    if method == "resid":
      return lambda: patching.get_act_patch_resid_pre(model, corrupt_t, cache,
                                                      metric).numpy()
    if method == "heads":
      return lambda: patching.get_act_patch_attn_head_out_all_pos(model, corrupt_t, cache,
                                                                  metric).numpy()

    def atp():
      names = lambda n: n.endswith("hook_resid_pre") or n.endswith("hook_z")
      acts, grads = {}, {}
      with torch.no_grad():
        _, clean_cache = model.run_with_cache(clean_t, names_filter=names)
      model.reset_hooks()
      model.add_hook(names, lambda x, hook: acts.__setitem__(hook.name, x.detach()), "fwd")
      model.add_hook(names, lambda x, hook: grads.__setitem__(hook.name, x.detach()), "bwd")
      metric(model(corrupt_t)).backward()  # One forward and one backward over the batch.
      model.reset_hooks()
      est = lambda name, l, dims: ((clean_cache[utils.get_act_name(name, l)]
                                    - acts[utils.get_act_name(name, l)])
                                   * grads[utils.get_act_name(name, l)]).sum(dims)
      resid = torch.stack([est("resid_pre", l, (0, 2)) for l in range(layers)])  # [layers, L]
      z = torch.stack([est("z", l, (0, 1, 3)) for l in range(layers)])  # [layers, heads]
      return np.concatenate([resid.reshape(-1).numpy(), z.reshape(-1).numpy()])
    return atp

  # Best batched use: one forward per layer, every target of the layer on the batch axis, the
  # metric from the last residual (no vocabulary projection).
  head = mlm.cls.predictions
  w = (head.decoder.weight[a] - head.decoder.weight[b]).detach()
  bias = float(head.bias[a] - head.bias[b])
  readout = lambda resid: (head.transform(resid[:, 0]) @ w + bias)
  n = clean.shape[0]
  with torch.no_grad():
    _, cache = model.run_with_cache(clean_t)

  def sweep(name: str, count: int, setter):
    out = np.zeros((layers, count))
    for l in range(layers):
      src = cache[utils.get_act_name(name, l)]
      rows = corrupt_t.repeat(count, 1)
      store = {}
      hooks = [(utils.get_act_name(name, l), lambda x, hook, src=src: setter(x, src, count)),
               (f"blocks.{layers - 1}.hook_normalized_resid_post",
                lambda x, hook: store.__setitem__("r", x))]
      with torch.no_grad():
        model.run_with_hooks(rows, return_type=None, fwd_hooks=hooks)
        out[l] = readout(store["r"]).reshape(count, n).mean(1).numpy()
    return out

  def set_pos(x, src, count):
    x = x.clone()
    for p in range(count):
      x[p * n:(p + 1) * n, p] = src[:, p]
    return x

  def set_head(x, src, count):
    x = x.clone()
    for h in range(count):
      x[h * n:(h + 1) * n, :, h] = src[:, :, h]
    return x

  if method == "resid":
    return lambda: sweep("resid_pre", L, set_pos)
  return lambda: sweep("z", heads, set_head)


def one(impl: str, method: str, n: int, length: int, repeats: int, out_path: str) -> dict:
  clean, corrupt, tokens = pairs(n, length)
  if impl == "papa_jax":
    run = ours(method, clean, corrupt, tokens)
  else:
    run = tl(method, clean, corrupt, tokens, batched=impl == "tl_batched")
  t0 = time.perf_counter()
  result = np.asarray(run(), np.float64)
  first = time.perf_counter() - t0
  walls, cpus = [], []
  for _ in range(repeats):
    c, t = time.process_time(), time.perf_counter()
    run()
    walls.append(time.perf_counter() - t)
    cpus.append(time.process_time() - c)
  np.save(out_path, result.reshape(-1))
  return dict(impl=impl, method=method, examples=n, first_call_s=first,
              wall_s=float(np.median(walls)), cpu_s=float(np.median(cpus)),
              peak_rss_mb=_rss_mb())


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--n", type=int, default=32)
  ap.add_argument("--length", type=int, default=24)
  ap.add_argument("--repeats", type=int, default=2)
  ap.add_argument("--json", default="")
  ap.add_argument("--one", nargs=3, help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.one:
    impl, method, path = args.one
    print(json.dumps(one(impl, method, args.n, args.length, args.repeats, path)))
    return
  import tempfile
  from benchmarks import common
  results, values = {}, {}
  tmp = tempfile.mkdtemp()
  for impl, methods in METHODS.items():
    for method in methods:
      path = os.path.join(tmp, f"{impl}_{method}.npy")
      results[(impl, method)] = common.child(__file__, "--one", impl, method, path, "--n",
                                             str(args.n), "--length", str(args.length),
                                             "--repeats", str(args.repeats))
      values[(impl, method)] = np.load(path)
      print(results[(impl, method)], flush=True)
  base = values[("papa_jax", "base")][0]
  n_resid = values[("papa_jax", "resid")].size
  atp = values[("papa_jax", "atp")]
  from scipy import stats
  for method, est in (("resid", atp[:n_resid]), ("heads", atp[n_resid:])):
    effect = values[("papa_jax", method)] - base
    k = 10
    top = set(np.argsort(-np.abs(effect))[:k]) & set(np.argsort(-np.abs(est))[:k])
    print(f"AtP vs exact patching, {method}: Spearman {stats.spearmanr(effect, est)[0]:.3f}, "
          f"top-{k} recall (by |effect|) {len(top) / k:.1f}, largest |effect| "
          f"{np.abs(effect).max():.3f}")
  rows = []
  for method in ("resid", "heads", "atp"):
    a = results[("papa_jax", method)]
    scale = np.abs(values[("tl", method)]).max()
    for peer in ("tl", "tl_batched"):
      if (peer, method) not in results:
        continue
      b = results[(peer, method)]
      rows.append(dict(
          sweep=method, peer=peer, papa_jax_s=a["wall_s"], peer_s=b["wall_s"],
          speedup=b["wall_s"] / a["wall_s"], papa_jax_cpu_s=a["cpu_s"], peer_cpu_s=b["cpu_s"],
          papa_jax_first_call_s=a["first_call_s"], papa_jax_peak_mb=a["peak_rss_mb"],
          peer_peak_mb=b["peak_rss_mb"],
          max_abs_diff=float(np.abs(values[("papa_jax", method)] - values[(peer, method)]).max()),
          metric_scale=float(scale)))
  common.report(f"Patching sweeps, all-MiniLM-L6-v2, {args.n} SST-2 dev sentences x "
                f"{args.length} tokens (resid: {6 * args.length} targets, heads: 72)", rows,
                args.json or None)


if __name__ == "__main__":
  main()
