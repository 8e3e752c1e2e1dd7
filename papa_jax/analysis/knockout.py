"""Attention knockout per (layer window, edge class), scored by a probe (Geva et al. 2023).

The ablation stage's probe is trained on the unmodified frozen encoder (`ablation.baseline_probe`:
the PAPA recipe, cached float32 features). Then, for every window of `knockout.window`
consecutive layers and every class of key positions (`CLASSES`), every query's edges to that
class are blocked in every head of the window (`interventions.Knockout`, `knockout.rule`), and
the same probe re-scores the analysis split (`effective.split`, `effective.max_examples`).
The (example, class) rows of a window are one batch axis (the class is traced data), and the
encoder starts at the window's first layer from the cached hidden states: one compiled program
per window. Each change from the baseline has a paired bootstrap interval over the examples
(one probe; `report.n_boot`, `report.seed`, `report.level`).

Writes `knockout/stats.json` and `stats.csv` (`change`: `[windows, 1, classes]`, one per-head
record whose head axis is every head at once, so the explorer and the report list it), the
intervals in the summary, and `change.png`; resumes per window from its partial file.
"""

from __future__ import annotations

import functools
import string
import unicodedata

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from papa_jax import head_maps, parallel, uncertainty
from papa_jax.analysis import ablation, figures, per_head
from papa_jax.attention import AttentionOverride
from papa_jax.interventions import Knockout, edges, position_classes, shifted_edges
from papa_jax.models.config import EncoderConfig
from papa_jax.models.encoder import Encoder
from papa_jax.probing import train
from papa_jax.stage import Setup, Stage
from papa_jax.workdir import resume
from papa_jax.workdir.layout import RELATIVE

CLASSES = ("cls", "sep", "punctuation", "other", "previous", "next")  # Key positions blocked.
PREVIOUS_NEXT = {"previous": -1, "next": +1}  # Classes relative to the query.
GROUPS = ablation.GROUPS + ("knockout",)
INPUTS = ablation.INPUTS


def punctuation_ids(tokenizer) -> tuple[int, ...]:
  """The vocabulary's tokens made only of punctuation (word-piece markers stripped)."""
  out = []
  for token, i in tokenizer.get_vocab().items():
    text = token.lstrip("#").lstrip("\u0120\u2581")
    if text and all(c in string.punctuation or unicodedata.category(c).startswith("P")
                    for c in text):
      out.append(int(i))
  return tuple(sorted(out))


def blocked_edges(data, tokenizer, classes) -> np.ndarray:
  """`[N, len(classes), L, L]` bool: per example, every real query's edges to each class."""
  mask = np.asarray(data.attention_mask)
  sets = position_classes(data.input_ids, mask, cls_id=tokenizer.cls_token_id,
                          sep_ids=(tokenizer.sep_token_id,),
                          punctuation_ids=punctuation_ids(tokenizer))
  return np.stack([np.asarray(shifted_edges(mask, PREVIOUS_NEXT[c]) if c in PREVIOUS_NEXT else
                              edges(mask, sets[c])) for c in classes], 1)


def make_knockout_logits(config: EncoderConfig, probe: nn.Module, first: int, last: int,
                         rule: str):
  """`(frozen, batch) -> probe logits` with the row's edges blocked in layers first..last.

  `frozen` is `(encoder params, probe params, hidden [N, K, L, D] float32 of the unmodified
  encoder)`; a batch row holds `example` and its `blocked [L, L]`.
  """
  module = Encoder(config)

  def fn(frozen, batch):
    enc, probe_params, hidden = frozen
    rows = batch["example"].shape[0]
    ov = AttentionOverride.intervene(Knockout(batch["blocked"], jnp.full((rows,), first),
                                              jnp.full((rows,), last), rule=rule))
    return ablation.probe_from_layer(module, probe, enc, probe_params, hidden, batch, ov, first)

  return fn


@functools.lru_cache(maxsize=32)
def _compiled(config: EncoderConfig, probe: nn.Module, first: int, last: int, rule: str, mesh):
  repl, shard = parallel.replicated(mesh), parallel.batch_sharding(mesh)
  return jax.jit(make_knockout_logits(config, probe, first, last, rule),
                 in_shardings=(repl, shard), out_shardings=repl)


def knock_window(config: EncoderConfig, probe: nn.Module, first: int, last: int, rule: str,
                 frozen, data, blocked: np.ndarray, mesh, batch_size: int,
                 desc: str = "") -> np.ndarray:
  """Probe outputs `[C, N, ...]`: row c holds every example with class c knocked out."""
  n, c = blocked.shape[:2]
  ex = np.repeat(np.arange(n), c).astype(np.int32)
  table = dict(example=ex, blocked=blocked.reshape((n * c,) + blocked.shape[2:]),
               input_ids=data.input_ids[ex], attention_mask=data.attention_mask[ex],
               token_type_ids=data.token_type_ids[ex])
  return ablation.per_row(_compiled(config, probe, first, last, rule, mesh), frozen, table, n,
                          c, mesh, batch_size, desc)


def windows(num_layers: int, width: int) -> list[tuple[int, int]]:
  """Every window of `width` consecutive layers, (first, last) inclusive."""
  return [(l, l + width - 1) for l in range(num_layers - width + 1)]


def _run(setup: Setup) -> dict:
  c, mc, task = setup.config, setup.model.config, setup.task
  classes, rule = tuple(c.knockout.classes), c.knockout.rule
  probe, probe_params, hidden, history, base_logits = ablation.baseline_probe(setup)
  data, metric = setup.analysis_data, task.headline_metric
  labels = data.labels
  frozen = parallel.put_replicated((setup.model.params, probe_params, jnp.asarray(hidden)),
                                   setup.mesh)
  blocked = blocked_edges(data, setup.tokenizer, classes)
  spans = windows(mc.num_layers, c.knockout.window)
  key = setup.fingerprint(GROUPS, INPUTS, stage="knockout")
  partial = setup.layout.partial("knockout")
  saved = resume.load(partial, key)
  preds = dict(saved.arrays) if saved else {}
  for i in range(saved.position if saved else 0, len(spans)):
    first, last = spans[i]
    logits = knock_window(mc, probe, first, last, rule, frozen, data, blocked, setup.mesh,
                          c.run.batch_size, desc=f"knockout layers {first}-{last}")
    preds[f"w{i}"] = np.stack([train.predictions(task.kind, lg) for lg in logits])
    if parallel.is_main_process():
      resume.save(partial, key, i + 1, preds)
  base = train.predictions(task.kind, base_logits)
  conds = [base] + [p for i in range(len(spans)) for p in preds[f"w{i}"]]
  rep = c.report
  seed = uncertainty.task_seed(rep.seed, task.name)
  scored = uncertainty.seed_scores_many(task, labels, [[p] for p in conds], n_boot=rep.n_boot,
                                        seed=seed)
  (base_full, base_b), rest = scored[0], scored[1:]
  change = np.zeros((len(spans), 1, len(classes)))
  rows = []
  for j, (full, b) in enumerate(rest):
    w, k = divmod(j, len(classes))
    diff = b[:, 0] - base_b[:, 0]
    ci = uncertainty.percentile_interval(diff, rep.level)
    change[w, 0, k] = full[0] - base_full[0]
    rows.append(dict(first=spans[w][0], last=spans[w][1], key_class=classes[k],
                     change=float(change[w, 0, k]), ci=ci,
                     within_noise=bool(ci[0] <= 0 <= ci[1])))
  baseline = float(base_full[0])
  summary = dict(model=c.model.name, task=task.name, split=c.effective.split, metric=metric,
                 baseline=baseline, eval_examples=len(labels), rule=rule,
                 window=c.knockout.window, classes=list(classes), changes=rows,
                 train_examples=len(setup.train_data), probe_history=history)
  if parallel.is_main_process():
    info = head_maps.HeadInfo(f"{metric} change when every query's edges to the class are "
                              "blocked in the window (all heads)", head_maps.LESS, metric)
    head_maps.write(setup.layout, "knockout", head_maps.maps_of(
        "knockout", {"change": info}, {"change": change}, examples=len(labels),
        split=c.effective.split, columns=classes), summary)
    figures.head_maps([(f"{cls}: score change", change[:, :, k])
                       for k, cls in enumerate(classes)],
                      setup.layout.figure("knockout", "change.png"),
                      per_head.label(setup, f"{metric} change when edges to each class are "
                                     f"knocked out in windows of {c.knockout.window} layer(s) "
                                     f"(row: first layer; baseline {baseline:.4f})", len(labels)),
                      center=True, cmap="RdBu_r")
    resume.remove(partial)
  logging.info("knockout: baseline %.4f; largest change %s", baseline,
               min(rows, key=lambda r: r["change"]) if rows else None)
  return summary


STAGE = Stage(name="knockout", run=_run, inputs=INPUTS, needs=(),
              writes=(RELATIVE.stats("knockout"),), groups=GROUPS, memory="forward")
