"""What a probe must beat: the best constant prediction, and whether a run learned anything.

A probe *learned nothing* when its dev score is not clearly above the score of the best
constant prediction (`constant_prediction`: the majority class for accuracy, the positive
class for F1, any class for MCC (0), the commonest tag for tagging; a correlation of 0 for
Pearson and Spearman): the `level` percentile interval of `probe - constant`, resampled on
the same dev examples (and, for several seeds, seeds of the probe), does not lie above 0.
Such a run's drops measure nothing, so every output marks it *uninformative* (`check`,
`probe_check`): results.json/.md, the log, the explorer and the report.

PAPA's sorting run learned nothing when its probe is not above chance in that sense, or when
its gates barely moved: the spread of sigmoid(gate logits) over heads is below
`GATE_SPREAD_MIN` (they start at 0.5 each), so the ranking that picks the constant heads is
mostly the order of near-ties (`sort_check`).
"""

from __future__ import annotations

import numpy as np

from papa_jax import uncertainty

GATE_SPREAD_MIN = 0.01  # max - min of sigmoid(gates) over heads; the gates start at 0.5 each.


def constant_prediction(task, labels: np.ndarray) -> tuple[str, float, np.ndarray] | None:
  """(label name, headline score, predictions) of the best constant prediction on the dev
  labels (ties: the first label); None for regression, where chance is a correlation of 0."""
  if task.kind == "regression":
    return None
  labels = np.asarray(labels)
  best, context = None, uncertainty.tagging_context(task, labels)  # Gold chunked once.
  for k, name in enumerate(task.label_names):
    pred = np.where(labels == -100, -100, k) if task.kind == "tagging" else np.full_like(labels, k)
    score = uncertainty.metric_score(task, labels, pred, context=context)
    if best is None or score > best[1]:
      best = (str(name), score, pred)
  return best


def check(base_mean: float, base_reps: np.ndarray | None, constant: tuple | None,
          constant_reps: np.ndarray | None, level: float, what: str = "baseline") -> dict:
  """Whether a probe's score is clearly above the best constant prediction (module docstring),
  from paired bootstrap replicates of both.

  Returns:
    dict(constant (label name or "any (correlation 0)"), constant_score, diff, diff_ci,
    informative (None: not checked), reason).
  """
  if base_reps is None:
    return dict(constant=None, constant_score=None, diff=None, diff_ci=None, informative=None,
                reason="not checked: no dev predictions of the baseline")
  name, score = ("any (correlation 0)", 0.0) if constant is None else constant[:2]
  out = dict(constant=name, constant_score=float(score), diff=float(base_mean - score))
  ci = uncertainty.percentile_interval(
      base_reps - (0.0 if constant_reps is None else constant_reps), level)
  ok = bool(np.all(np.isfinite(ci)) and ci[0] > 0)
  out.update(diff_ci=ci, informative=ok, reason="" if ok else (
      f"{what} {base_mean:.4f} vs constant prediction {name!r} {score:.4f}: the "
      f"{100 * level:.0f}% interval of the difference [{ci[0]:+.4f}, {ci[1]:+.4f}] "
      "does not lie above 0"))
  return out


def probe_check(task, labels: np.ndarray, preds, *, level: float = 0.95,
                n_boot: int = uncertainty.N_BOOT, seed: int = 0, what: str = "baseline") -> dict:
  """`check` of a probe's dev predictions (per seed: `{seed: array}` or a sequence) against
  the best constant prediction, on the same example resamples (`uncertainty`'s streams with
  `seed`; the probe's seeds are resampled on stream 0, as the report's baseline)."""
  constant = constant_prediction(task, labels)
  conditions = [preds] + ([[constant[2]]] if constant is not None else [])
  scored = uncertainty.seed_scores_many(task, labels, conditions, n_boot=n_boot, seed=seed)
  full, b = scored[0]
  reps = uncertainty.seed_means(b, seed=seed, stream=0)
  return check(float(full.mean()), reps, constant,
               scored[1][1][:, 0] if constant is not None else None, level, what)


def sort_check(task, labels: np.ndarray, preds: np.ndarray, gates: np.ndarray, *,
               level: float = 0.95, n_boot: int = uncertainty.N_BOOT, seed: int = 0) -> dict:
  """Whether PAPA's sorting run learned anything (module docstring): `probe_check` of its
  last-epoch dev predictions, and the spread of its gates.

  Returns:
    `probe_check`'s dict with gate_spread (max - min of sigmoid(gates)), and informative and
    reason covering both.
  """
  out = probe_check(task, labels, [preds], level=level, n_boot=n_boot, seed=seed,
                    what="sorting probe")
  sig = 1.0 / (1.0 + np.exp(-np.asarray(gates, np.float64)))
  spread = float(sig.max() - sig.min())
  reasons = [out["reason"]] if out["reason"] else []
  if spread < GATE_SPREAD_MIN:
    reasons.append(f"its gates barely moved (sigmoid spread {spread:.4f} < {GATE_SPREAD_MIN})")
  out.update(gate_spread=spread, informative=bool(out["informative"]) and
             spread >= GATE_SPREAD_MIN, reason="; ".join(reasons))
  return out


def warning(what: str, c: dict | None) -> str:
  """One line saying that `what` learned nothing and why ("" when it learned something or
  was not checked)."""
  if not c or c.get("informative") is not False:
    return ""
  return f"{what} learned nothing (uninformative): {c['reason']}."
