"""Activation patching and attribution patching of (clean, corrupt) pairs, scored by a probe.

Pairs: `patching.pairs` (a CSV, TSV or JSON Lines file: `causal/pairs.py`) or, when empty,
pairs built from the analysis split (`effective.split`, `effective.max_examples`) by the
substitution rule: each sentence's first word piece that is one of `SUBSTITUTIONS`
(sentiment words with an antonym, both one word piece in the model's vocabulary) replaced by
its antonym, so both sides have equal lengths; at most `patching.max_pairs`. Metric: the
ablation stage's baseline probe (`ablation.baseline_probe`) as the log-probability of the
class it gives the clean sentence (`metrics.probe_log_prob`).

Per site of `patching.sites`: exact patching of the clean run's activation into the corrupt
run at every target (`causal.patching.sweep`: every (layer, head) for "context", every (layer,
position) for the residual and block-output sites) and AtP of the same targets from one
forward and one backward pass, and AtP*'s GradDrop magnitude (one pass per layer); their
agreement with exact patching (Spearman over the targets' means over pairs, top-10 recall;
GradDrop against |exact|) in the summary. Writes `patching/stats.json` (per-head records:
a head site's mean change of the metric over pairs, exact, AtP and GradDrop, `[layers,
heads]`; a position site's per
layer and position class, `[layers, 1, 3]` with columns cls, changed and other: the mean over
pairs of the change at [CLS], at the substituted positions and at every other real token),
per-position records (a position site's change per pair, layer and token, with the pair's
word pieces: `head_maps.TokenMap`, listed by the explorer),
`patching/effects.npz` (every pair's changes, its tokens) and `effects.png`; resumes per site.
The exact sweep's rows split over the mesh's devices (one process; `patching.sweep`); AtP and
GradDrop run on one device (one forward and backward pass per layer).
"""

from __future__ import annotations

import jax
import numpy as np
from absl import logging
from scipy import stats as scipy_stats

from papa_jax import head_maps, parallel
from papa_jax.analysis import ablation, figures, per_head
from papa_jax.causal import metrics, pairs as pairs_lib, patching
from papa_jax.config.fields import PATCHING_SITES
from papa_jax.errors import ConfigError
from papa_jax.stage import Setup, Stage
from papa_jax.workdir import resume, storage
from papa_jax.workdir.layout import RELATIVE

GROUPS = ablation.GROUPS + ("patching",)
INPUTS = ablation.INPUTS
HEAD_SITES = ("context",)
POSITION_SITES = tuple(s for s in PATCHING_SITES if s not in HEAD_SITES)
CLASSES = ("cls", "changed", "other")
SUBSTITUTIONS = (("good", "bad"), ("great", "terrible"), ("best", "worst"), ("better", "worse"),
                 ("funny", "boring"), ("beautiful", "ugly"), ("love", "hate"),
                 ("excellent", "awful"), ("fun", "dull"), ("wonderful", "horrible"),
                 ("brilliant", "stupid"), ("strong", "weak"), ("smart", "dumb"),
                 ("entertaining", "tedious"), ("charming", "annoying"), ("success", "failure"))


def substitution_ids(tokenizer) -> dict[int, int]:
  """Word-piece id -> its antonym's, both ways, for the `SUBSTITUTIONS` whose two words are
  one word piece each in this vocabulary."""
  out = {}
  for a, b in SUBSTITUTIONS:
    ia, ib = (tokenizer(w, add_special_tokens=False)["input_ids"] for w in (a, b))
    if len(ia) == len(ib) == 1:
      out.setdefault(ia[0], ib[0])
      out.setdefault(ib[0], ia[0])
  return out


def substitution_pairs(data, tokenizer, max_pairs: int) -> tuple[dict, dict, np.ndarray]:
  """(clean, corrupt) batches from `data`'s sentences with a substitution word (the first one
  swapped), at most `max_pairs`, and their rows in `data`."""
  swap = substitution_ids(tokenizer)
  ids, mask = np.asarray(data.input_ids), np.asarray(data.attention_mask)
  rows, corrupt = [], []
  for i in range(len(ids)):
    hits = [p for p in np.flatnonzero(mask[i]) if int(ids[i, p]) in swap]
    if hits:
      c = ids[i].copy()
      c[hits[0]] = swap[int(ids[i, hits[0]])]
      rows.append(i)
      corrupt.append(c)
    if len(rows) == max_pairs:
      break
  rows = np.asarray(rows, np.int64)
  clean = dict(input_ids=ids[rows], attention_mask=mask[rows],
               token_type_ids=np.asarray(data.token_type_ids)[rows])
  return clean, dict(clean, input_ids=np.asarray(corrupt).reshape(len(rows), -1)), rows


def _pairs(setup: Setup) -> tuple[dict, dict, str]:
  c = setup.config.patching
  if c.pairs:
    read = pairs_lib.read_pairs(c.pairs)[:c.max_pairs]
    clean, corrupt = pairs_lib.encode_pairs(read, setup.tokenizer, setup.max_length,
                                            path=c.pairs, pad_to=setup.max_length)
    return clean, corrupt, f"{c.pairs} ({len(read)} pairs)"
  clean, corrupt, rows = substitution_pairs(setup.analysis_data, setup.tokenizer, c.max_pairs)
  if not len(rows):
    raise ConfigError(f"patching: no sentence of the {setup.config.effective.split} split "
                      f"({len(setup.analysis_data)} examples) holds a substitution word "
                      f"({', '.join(w for p in SUBSTITUTIONS for w in p)}); give a pair file "
                      "(patching.pairs).")
  return clean, corrupt, "substitution rule"


def _targets(site: str, layers: int, heads: int, length: int) -> patching.Targets:
  if site in HEAD_SITES:
    return patching.Targets.grid(layers, heads=range(heads))
  return patching.Targets.grid(layers, positions=range(length))


def _position_classes(clean: dict, corrupt: dict) -> np.ndarray:
  """`[P, L, 3]` bool: [CLS] (position 0), the positions the pair changes, other real ones."""
  real = clean["attention_mask"] > 0
  changed = real & (clean["input_ids"] != corrupt["input_ids"])
  cls = np.zeros_like(real)
  cls[:, 0] = True
  return np.stack([cls, changed, real & ~cls & ~changed], -1)


def _agreement(exact: np.ndarray, atp: np.ndarray, k: int = 10) -> dict:
  """Spearman of AtP's and exact patching's means over the pairs, and top-k recall by
  |exact|."""
  e, a = exact.mean(1), atp.mean(1)
  top = set(np.argsort(-np.abs(e))[:k]) & set(np.argsort(-np.abs(a))[:k])
  rho = scipy_stats.spearmanr(e, a)[0] if len(e) > 2 else float("nan")
  return dict(spearman=float(rho), top_k=k, recall=len(top) / min(k, len(e)))


def token_maps(arrays: dict, sites, clean: dict, corrupt: dict, tokenizer, layers: int,
               length: int, labels: dict) -> list[head_maps.TokenMap]:
  """Per position site and kind, each pair's change `[layers, its real tokens]` with the clean
  sentence's word pieces (the substituted one as "clean→corrupt")."""
  out = []
  for site in sites:
    if site in HEAD_SITES:
      continue
    for kind, label in labels.items():
      eff = np.asarray(arrays[f"{kind}/{site}"])  # [layers * length, P]
      examples = []
      for i in range(eff.shape[1]):
        n = int(clean["attention_mask"][i].sum())
        a, b = (tokenizer.convert_ids_to_tokens(np.asarray(x["input_ids"][i, :n]).tolist())
                for x in (clean, corrupt))
        toks = [t if t == u else f"{t}→{u}" for t, u in zip(a, b)]
        swaps = ", ".join(t for t, u in zip(a, b) if t != u and t)
        text = tokenizer.decode(clean["input_ids"][i, :n], skip_special_tokens=True)
        examples.append(dict(title=f"pair {i} ({swaps or 'no change'} swapped): {text}",
                             tokens=toks, values=eff[:, i].reshape(layers, length)[:, :n]))
      out.append(head_maps.TokenMap(
          "patching", f"{kind}_{site}", f"{label} of log p(clean class) when {site} at one "
          "layer and position is patched from the clean run", tuple(
              f"layer {l}" for l in range(layers)), tuple(examples), "nats"))
  return out


def _run(setup: Setup) -> dict:
  c, mc = setup.config, setup.model.config
  pc = c.patching
  if setup.task.kind != "classification":
    raise ConfigError(f"patching: a {setup.task.kind} task; the stage's metric is a "
                      "classification probe's log-probability (sentence tasks).")
  probe, probe_params, _, history, _ = ablation.baseline_probe(setup)
  clean, corrupt, source = _pairs(setup)
  # Positions past every pair's last real token are padding: not patched (the arrays keep
  # data.max_length, the probe's input length).
  length = int(max(clean["attention_mask"].sum(1).max(), corrupt["attention_mask"].sum(1).max()))
  params = jax.device_get(probe_params)
  metric = metrics.probe_log_prob(probe, params)
  model = setup.model
  logits = metrics.probe_logits(probe, params, model.apply(
      clean["input_ids"], clean["attention_mask"], token_type_ids=clean["token_type_ids"]),
      clean)
  target = np.asarray(np.argmax(np.asarray(logits), -1), np.int32)  # The clean run's class.
  clean, corrupt = dict(clean, target_class=target), dict(corrupt, target_class=target)
  base = dict(clean=patching.run_metric(model, clean, metric),
              corrupt=patching.run_metric(model, corrupt, metric))
  key = setup.fingerprint(GROUPS, INPUTS, stage="patching")
  partial = setup.layout.partial("patching")
  saved = resume.load(partial, key)
  arrays = dict(saved.arrays) if saved else {}
  sites = tuple(pc.sites)
  for i in range(saved.position if saved else 0, len(sites)):
    site = sites[i]
    targets = _targets(site, mc.num_layers, mc.num_heads, length)
    logging.info("patching: %s, %d targets x %d pairs (exact, then AtP)", site, len(targets),
                 len(target))
    acts = patching.activations(model, clean, site)
    arrays[f"exact/{site}"] = patching.sweep(model, corrupt, acts, site, targets, metric,
                                             chunk=pc.chunk, mesh=setup.mesh) - base["corrupt"]
    per_site = patching.attribution(model, corrupt, {site: acts}, metric)[site]
    arrays[f"atp/{site}"] = patching.at_targets(per_site, targets)
    arrays[f"grad_drop/{site}"] = patching.grad_drop(model, corrupt, {site: acts},
                                                     {site: targets}, metric)[site]
    if parallel.is_main_process():
      resume.save(partial, key, i + 1, arrays)
  classes = _position_classes(clean, corrupt)
  maps, summary_sites = {}, {}
  for site in sites:
    for kind in ("exact", "atp", "grad_drop"):
      eff = arrays[f"{kind}/{site}"]  # [T, P]
      if site in HEAD_SITES:
        maps[f"{kind}_{site}"] = eff.mean(1).reshape(mc.num_layers, mc.num_heads)
      else:
        per = eff.reshape(mc.num_layers, length, -1).transpose(2, 0, 1)  # [P, layers, L]
        w = classes[:, :length].astype(np.float64)  # [P, L, 3]
        sums = np.einsum("pkl,plc->kc", per, w)  # [layers, 3]
        counts = np.maximum(w.sum((0, 1)), 1)
        maps[f"{kind}_{site}"] = (sums / counts)[:, None, :]
    exact = arrays[f"exact/{site}"]
    summary_sites[site] = dict(atp=_agreement(exact, arrays[f"atp/{site}"]),
                               grad_drop=_agreement(np.abs(exact), arrays[f"grad_drop/{site}"]))
  gap = base["clean"] - base["corrupt"]
  summary = dict(model=c.model.name, task=setup.task.name, split=c.effective.split,
                 pairs=len(target), pair_source=source, length=length,
                 metric="log-probability of the probe's class for the clean sentence",
                 clean=float(base["clean"].mean()), corrupt=float(base["corrupt"].mean()),
                 gap=float(gap.mean()), agreement=summary_sites,
                 train_examples=len(setup.train_data), probe_history=history)
  if parallel.is_main_process():
    what = {"exact": "exact change", "atp": "AtP estimate of the change",
            "grad_drop": "GradDrop magnitude (AtP*) of the change"}
    infos = {f"{kind}_{site}": head_maps.HeadInfo(
        f"{what[kind]} of log p(clean class) when {site} is patched from the clean run, mean "
        "over pairs", head_maps.MORE, "nats") for kind in what for site in sites}
    head_maps.write(setup.layout, "patching", head_maps.maps_of(
        "patching", infos, maps, examples=len(target), split=c.effective.split,
        columns=CLASSES), summary, token_maps=token_maps(
            arrays, sites, clean, corrupt, setup.tokenizer, mc.num_layers, length, what))
    with storage.open(setup.layout.path("patching", "effects.npz"), "wb") as f:
      np.savez(f, clean_ids=clean["input_ids"], corrupt_ids=corrupt["input_ids"],
               mask=clean["attention_mask"], target_class=target, **base,
               **{k.replace("/", "_"): v for k, v in arrays.items()})
    figures.head_maps(
        [(name, m if m.ndim == 2 else m[:, 0]) for name, m in maps.items()],
        setup.layout.figure("patching", "effects.png"),
        per_head.label(setup, f"change of log p(clean class) when patched from the clean run "
                       f"(mean over {len(target)} pairs; clean - corrupt {gap.mean():.3f})",
                       len(target)), shared_scale=False, center=True, cmap="RdBu_r")
    resume.remove(partial)
  logging.info("patching: %d pairs, clean %.4f, corrupt %.4f; AtP vs exact %s", len(target),
               summary["clean"], summary["corrupt"], summary_sites)
  return summary


STAGE = Stage(name="patching", run=_run, inputs=INPUTS, needs=(),
              writes=(RELATIVE.stats("patching"),), groups=GROUPS)
