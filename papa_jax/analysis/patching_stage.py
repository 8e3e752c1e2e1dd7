"""Activation patching and attribution patching of (clean, corrupt) pairs, scored by a probe.

Pairs: `patching.pairs` (a CSV, TSV or JSON Lines file: `causal/pairs.py`) or, when empty,
pairs built from the analysis split (`effective.split`, `effective.max_examples`) by the
substitution rule: each sentence's first word piece that is one of `SUBSTITUTIONS`
(sentiment words with an antonym, both one word piece in the model's vocabulary) replaced by
its antonym, so both sides have equal lengths; at most `patching.max_pairs`. Metric: the
ablation stage's baseline probe (`ablation.baseline_probe`), one per probe seed of
`papa.seeds`, as the log-probability of the class it gives the clean sentence
(`metrics.probe_log_prob`). Every effect is a mean over pairs and seeds, with a percentile
interval from a two-level bootstrap (pairs, then seeds: `pair_interval`; `report.n_boot`,
`report.level`, `report.seed`) for the gap, each target and each position class.

Per site of `patching.sites`: exact patching of the clean run's activation into the corrupt
run at every target (`causal.patching.sweep`: every (layer, head) for "context", every (layer,
position) for the residual and block-output sites) and AtP of the same targets from one
forward and one backward pass, and AtP*'s GradDrop magnitude (one pass per layer); position
sites patch every position that is real in some pair (the PAPA layout's last [SEP] too); their
agreement with exact patching (Spearman over the targets' means over pairs, top-10 recall;
GradDrop against |exact|) in the summary. Writes `patching/stats.json` (per-head records:
a head site's mean change of the metric over pairs, exact, AtP and GradDrop, `[layers,
heads]`; a position site's per
layer and position class, `[layers, 1, 3]` with columns cls, changed and other: the mean over
pairs of the change at [CLS], at the substituted positions and at every other real token),
per-position records (a position site's change per pair, layer and token, with the pair's
word pieces: `head_maps.TokenMap`, listed by the explorer),
`patching/effects.npz` (every pair's changes, its tokens) and `effects.png`; resumes per site.
The exact sweep's rows split over each process's devices and its chunks over the processes
(`patching.sweep`); AtP and GradDrop run on one device (one forward and backward pass per
layer).
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


def _targets(site: str, layers: int, heads: int, positions: np.ndarray) -> patching.Targets:
  if site in HEAD_SITES:
    return patching.Targets.grid(layers, heads=range(heads))
  return patching.Targets.grid(layers, positions=positions)


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
               positions: np.ndarray, labels: dict) -> list[head_maps.TokenMap]:
  """Per position site and kind, each pair's change `[layers, its real tokens]` (`arrays`:
  `{"kind/site": [T, P]}`, targets layer-major over `positions`) with the clean sentence's
  word pieces at its real positions (the substituted one as "clean→corrupt")."""
  out = []
  for site in sites:
    if site in HEAD_SITES:
      continue
    for kind, label in labels.items():
      eff = np.asarray(arrays[f"{kind}/{site}"])  # [layers * len(positions), P]
      examples = []
      for i in range(eff.shape[1]):
        real = np.flatnonzero(clean["attention_mask"][i])  # With the PAPA layout's last [SEP].
        a, b = (tokenizer.convert_ids_to_tokens(np.asarray(x["input_ids"][i, real]).tolist())
                for x in (clean, corrupt))
        toks = [t if t == u else f"{t}→{u}" for t, u in zip(a, b)]
        swaps = ", ".join(t for t, u in zip(a, b) if t != u and t)
        text = tokenizer.decode(clean["input_ids"][i, real], skip_special_tokens=True)
        values = eff[:, i].reshape(layers, len(positions))[:, np.searchsorted(positions, real)]
        examples.append(dict(title=f"pair {i} ({swaps or 'no change'} swapped): {text}",
                             tokens=toks, values=values))
      out.append(head_maps.TokenMap(
          "patching", f"{kind}_{site}", f"{label} of log p(clean class) when {site} at one "
          "layer and position is patched from the clean run", tuple(
              f"layer {l}" for l in range(layers)), tuple(examples), "nats"))
  return out


def pair_interval(num: np.ndarray, den: np.ndarray | None = None, *, n_boot: int,
                  level: float, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """The estimate `sum_p mean_s num[s, p] / sum_p den[p]` (`den` None: the mean over pairs p)
  and its percentile interval from a two-level bootstrap: each replicate draws the pairs with
  replacement, then the probe seeds s (every seed scores the same pairs). `num`: `[S, P, ...]`;
  `den`: `[P, ...]` broadcasting against `num[0]`. Returns (estimate, low, high)."""
  num = np.asarray(num, np.float64)
  seeds, pairs = num.shape[:2]
  den = np.ones((pairs,) + (1,) * (num.ndim - 2)) if den is None else np.asarray(den, float)
  ratio = lambda n, d: n / np.where(d > 0, d, np.nan)
  point = ratio(num.mean(0).sum(0), den.sum(0))
  rng = np.random.default_rng(seed)
  reps = np.empty((n_boot,) + point.shape)
  for b in range(n_boot):
    p, s = rng.integers(pairs, size=pairs), rng.integers(seeds, size=seeds)
    reps[b] = ratio(num[s][:, p].mean(0).sum(0), den[p].sum(0))
  low, high = np.percentile(reps, [50 * (1 - level), 50 * (1 + level)], axis=0)
  return point, low, high


def _probes(setup: Setup, clean: dict, corrupt: dict, seeds) -> dict:
  """Per probe seed: the baseline probe's metric, the pairs with the class it gives each
  clean sentence (`target_class`), the unpatched metrics and the probe's history."""
  feats, model, out = ablation.probe_features(setup), setup.model, {}
  for seed in seeds:
    probe, params, _, history, _ = ablation.baseline_probe(setup, seed, feats)
    params = jax.device_get(params)
    metric = metrics.probe_log_prob(probe, params)
    logits = metrics.probe_logits(probe, params, model.apply(
        clean["input_ids"], clean["attention_mask"], token_type_ids=clean["token_type_ids"]),
        clean)
    target = np.asarray(np.argmax(np.asarray(logits), -1), np.int32)  # The clean run's class.
    cl, co = dict(clean, target_class=target), dict(corrupt, target_class=target)
    out[seed] = dict(metric=metric, clean=cl, corrupt=co, history=history, target=target,
                     base=dict(clean=patching.run_metric(model, cl, metric),
                               corrupt=patching.run_metric(model, co, metric)))
  return out


def _top(point, low, high, site: str, layers: int, positions: np.ndarray, k: int = 5
         ) -> list[dict]:
  """The `k` targets of largest |estimate|, with their intervals."""
  out = []
  for t in np.argsort(-np.abs(point))[:k]:
    layer, where = divmod(int(t), len(point) // layers)
    where = where if site in HEAD_SITES else int(positions[where])
    out.append({"layer": layer, "head" if site in HEAD_SITES else "position": where,
                "change": float(point[t]), "ci": [float(low[t]), float(high[t])],
                "excludes_0": bool(low[t] > 0 or high[t] < 0)})
  return out


def _run(setup: Setup) -> dict:
  c, mc = setup.config, setup.model.config
  pc, rep = c.patching, c.report
  if setup.task.kind != "classification":
    raise ConfigError(f"patching: a {setup.task.kind} task; the stage's metric is a "
                      "classification probe's log-probability (sentence tasks).")
  clean, corrupt, source = _pairs(setup)
  # Position sites patch every position that is real in some pair (the arrays keep
  # data.max_length, the probe's input length; the PAPA layout's last [SEP] is at L - 1).
  positions = np.flatnonzero((np.asarray(clean["attention_mask"]) > 0).any(0)
                             | (np.asarray(corrupt["attention_mask"]) > 0).any(0))
  length = len(positions)
  seeds, model, sites = tuple(setup.seeds), setup.model, tuple(pc.sites)
  probes = _probes(setup, clean, corrupt, seeds)
  key = setup.fingerprint(GROUPS, INPUTS, stage="patching", seeds=list(seeds))
  partial = setup.layout.partial("patching")
  saved = resume.load(partial, key)
  arrays = dict(saved.arrays) if saved else {}
  units = [(seed, site) for seed in seeds for site in sites]
  for i in range(saved.position if saved else 0, len(units)):
    seed, site = units[i]
    pr = probes[seed]
    targets = _targets(site, mc.num_layers, mc.num_heads, positions)
    logging.info("patching: probe seed %d, %s, %d targets x %d pairs (exact, AtP, GradDrop)",
                 seed, site, len(targets), len(pr["target"]))
    acts = patching.activations(model, pr["clean"], site)
    arrays[f"exact/{site}/{seed}"] = patching.sweep(
        model, pr["corrupt"], acts, site, targets, pr["metric"], chunk=pc.chunk,
        mesh=setup.mesh, desc=f"patching {site} (probe seed {seed})") - pr["base"]["corrupt"]
    per_site = patching.attribution(model, pr["corrupt"], {site: acts}, pr["metric"])[site]
    arrays[f"atp/{site}/{seed}"] = patching.at_targets(per_site, targets)
    arrays[f"grad_drop/{site}/{seed}"] = patching.grad_drop(
        model, pr["corrupt"], {site: acts}, {site: targets}, pr["metric"])[site]
    if parallel.is_main_process():
      resume.save(partial, key, i + 1, arrays)
  kinds = ("exact", "atp", "grad_drop")
  eff = {f"{kind}/{site}": np.stack([arrays[f"{kind}/{site}/{s}"] for s in seeds])
         for kind in kinds for site in sites}  # [S, T, P]
  classes = _position_classes(clean, corrupt)[:, positions].astype(np.float64)  # [P, L', 3]
  boot = dict(n_boot=rep.n_boot, level=rep.level, seed=rep.seed)

  def class_sums(e: np.ndarray) -> np.ndarray:  # [S, T, P] -> [S, P, layers, 3]
    per = e.reshape(len(seeds), mc.num_layers, length, -1).transpose(0, 3, 1, 2)
    return np.einsum("spkl,plc->spkc", per, classes)

  maps, summary_sites = {}, {}
  for site in sites:
    for kind in kinds:
      e = eff[f"{kind}/{site}"]
      if site in HEAD_SITES:
        maps[f"{kind}_{site}"] = e.mean((0, 2)).reshape(mc.num_layers, mc.num_heads)
      else:  # Per layer and position class: pooled over the pairs' positions in the class.
        sums = class_sums(e)  # [S, P, layers, 3]
        maps[f"{kind}_{site}"] = (sums.mean(0).sum(0) / np.maximum(
            classes.sum((0, 1)), 1))[:, None, :]
    exact = eff[f"exact/{site}"]
    ex_mean = exact.mean(0)
    point, low, high = pair_interval(exact.transpose(0, 2, 1), **boot)  # Per target.
    summary_sites[site] = dict(
        atp=_agreement(ex_mean, eff[f"atp/{site}"].mean(0)),
        grad_drop=_agreement(np.abs(ex_mean), eff[f"grad_drop/{site}"].mean(0)),
        top=_top(point, low, high, site, mc.num_layers, positions),
        targets_excluding_0=int(((low > 0) | (high < 0)).sum()), targets=len(point))
    if site not in HEAD_SITES:
      point, low, high = pair_interval(class_sums(exact), classes.sum(1)[:, None, :], **boot)
      summary_sites[site]["classes"] = {
          cls: [dict(layer=l, change=float(point[l, j]), ci=[float(low[l, j]),
                                                           float(high[l, j])])
                for l in range(mc.num_layers)] for j, cls in enumerate(CLASSES)}
  gaps = np.stack([probes[s]["base"]["clean"] - probes[s]["base"]["corrupt"] for s in seeds])
  gap, gap_low, gap_high = pair_interval(gaps, **boot)
  first = probes[seeds[0]]
  summary = dict(model=c.model.name, task=setup.task.name, split=c.effective.split,
                 pairs=len(first["target"]), pair_source=source, length=length,
                 positions=positions.tolist(),
                 metric="log-probability of the probe's class for the clean sentence",
                 probe_seeds=list(seeds), interval=dict(level=rep.level, n_boot=rep.n_boot,
                                                        resampled="pairs, then probe seeds"),
                 clean=float(np.mean([probes[s]["base"]["clean"] for s in seeds])),
                 corrupt=float(np.mean([probes[s]["base"]["corrupt"] for s in seeds])),
                 gap=float(gap), gap_ci=[float(gap_low), float(gap_high)],
                 agreement=summary_sites, train_examples=len(setup.train_data),
                 probe_history={s: probes[s]["history"] for s in seeds})
  if parallel.is_main_process():
    what = {"exact": "exact change", "atp": "AtP estimate of the change",
            "grad_drop": "GradDrop magnitude (AtP*) of the change"}
    infos = {f"{kind}_{site}": head_maps.HeadInfo(
        f"{what[kind]} of log p(clean class) when {site} is patched from the clean run, mean "
        f"over pairs and {len(seeds)} probe seed(s)", head_maps.MORE, "nats")
        for kind in what for site in sites}
    mean_eff = {k: v.mean(0) for k, v in eff.items()}
    head_maps.write(setup.layout, "patching", head_maps.maps_of(
        "patching", infos, maps, examples=len(first["target"]), split=c.effective.split,
        columns=CLASSES), summary, token_maps=token_maps(
            mean_eff, sites, clean, corrupt, setup.tokenizer, mc.num_layers, positions, what))
    with storage.open(setup.layout.path("patching", "effects.npz"), "wb") as f:
      np.savez(f, clean_ids=clean["input_ids"], corrupt_ids=corrupt["input_ids"],
               mask=clean["attention_mask"], seeds=np.asarray(seeds), positions=positions,
               target_class=np.stack([probes[s]["target"] for s in seeds]),
               clean=np.stack([probes[s]["base"]["clean"] for s in seeds]),
               corrupt=np.stack([probes[s]["base"]["corrupt"] for s in seeds]),
               **{k.replace("/", "_"): v for k, v in eff.items()})
    figures.head_maps(
        [(name, m if m.ndim == 2 else m[:, 0]) for name, m in maps.items()],
        setup.layout.figure("patching", "effects.png"),
        per_head.label(setup, f"change of log p(clean class) when patched from the clean run "
                       f"(mean over {len(first['target'])} pairs and {len(seeds)} probe "
                       f"seed(s); clean - corrupt {gap:.3f})", len(first["target"])),
        shared_scale=False, center=True, cmap="RdBu_r")
    resume.remove(partial)
  logging.info("patching: %d pairs x %d probe seeds, gap %.4f [%.4f, %.4f]; AtP vs exact %s",
               len(first["target"]), len(seeds), gap, gap_low, gap_high,
               {s: v["atp"] for s, v in summary_sites.items()})
  return summary


STAGE = Stage(name="patching", run=_run, inputs=INPUTS, needs=(),
              writes=(RELATIVE.stats("patching"),), groups=GROUPS, memory="through")
