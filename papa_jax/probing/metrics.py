"""Task metrics on host arrays (checked against scikit-learn, scipy, seqeval).

Entity-level scores follow seqeval's default (conlleval) chunking of IOB tags.
"""

from __future__ import annotations
from papa_jax.errors import ConfigError

from typing import Sequence

import numpy as np
import scipy.stats


def accuracy(pred: np.ndarray, label: np.ndarray) -> float:
  return float(np.mean(np.asarray(pred) == np.asarray(label))) if len(label) else 0.0


def matthews_corrcoef(pred: np.ndarray, label: np.ndarray) -> float:
  """Multi-class MCC (Gorodkin), as sklearn; 0 when undefined."""
  classes = np.union1d(pred, label)
  idx = {c: i for i, c in enumerate(classes)}
  c = np.zeros((len(classes), len(classes)), np.float64)
  np.add.at(c, (np.vectorize(idx.get)(label), np.vectorize(idx.get)(pred)), 1)
  t, p = c.sum(1), c.sum(0)
  n, correct = c.sum(), np.trace(c)
  cov_pp = n * n - p @ p
  cov_tt = n * n - t @ t
  denom = np.sqrt(cov_pp * cov_tt)
  return float((correct * n - t @ p) / denom) if denom else 0.0


def binary_f1(pred: np.ndarray, label: np.ndarray, positive: int = 1) -> float:
  pred, label = np.asarray(pred) == positive, np.asarray(label) == positive
  tp = np.sum(pred & label)
  denom = pred.sum() + label.sum()
  return float(2 * tp / denom) if denom else 0.0


def _correlation(fn, x: np.ndarray, y: np.ndarray) -> float:
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
    return 0.0  # Undefined (a constant input); 0, as for Matthews.
  return float(fn(x, y).statistic)


def pearson(x: np.ndarray, y: np.ndarray) -> float:
  return _correlation(scipy.stats.pearsonr, x, y)


def spearman(x: np.ndarray, y: np.ndarray) -> float:
  return _correlation(scipy.stats.spearmanr, x, y)


def _split_tag(tag: str) -> tuple[str, str]:
  """seqeval's (non-suffix) split: first character, and the type after '-'."""
  return tag[0], tag[1:].split("-", maxsplit=1)[-1] or "_"


def _end_of_chunk(prev_tag, tag, prev_type, type_) -> bool:
  return (prev_tag in ("E", "S")
          or (prev_tag in ("B", "I") and tag in ("B", "S", "O"))
          or (prev_tag != "O" and prev_type != type_))


def _start_of_chunk(prev_tag, tag, prev_type, type_) -> bool:
  return (tag in ("B", "S")
          or (prev_tag in ("E", "S", "O") and tag in ("E", "I"))
          or (tag != "O" and prev_type != type_))


def entities(tags: Sequence[str]) -> set[tuple[str, int, int]]:
  """(type, start, end) chunks of one sequence, conlleval rules."""
  out = set()
  prev_tag, prev_type, start = "O", "", 0
  for i, t in enumerate(list(tags) + ["O"]):
    tag, type_ = _split_tag(t)
    if _end_of_chunk(prev_tag, tag, prev_type, type_):
      out.add((prev_type, start, i - 1))
    if _start_of_chunk(prev_tag, tag, prev_type, type_):
      start = i
    prev_tag, prev_type = tag, type_
  return out


def entity_scores(pred: Sequence[Sequence[str]], label: Sequence[Sequence[str]]) -> dict:
  """Micro precision/recall/F1 over entities, and token accuracy."""
  tp = n_pred = n_true = 0
  for i, (p, t) in enumerate(zip(pred, label)):
    ep = {(i,) + e for e in entities(p)}
    et = {(i,) + e for e in entities(t)}
    tp += len(ep & et)
    n_pred += len(ep)
    n_true += len(et)
  prec = tp / n_pred if n_pred else 0.0
  rec = tp / n_true if n_true else 0.0
  f1 = 2 * prec * rec / (prec + rec) if prec + rec else 0.0
  flat_p = [x for s in pred for x in s]
  flat_t = [x for s in label for x in s]
  return dict(precision=prec, recall=rec, f1=f1,
              accuracy=accuracy(np.array(flat_p), np.array(flat_t)))


def classification_scores(metrics: Sequence[str], pred, label) -> dict:
  out = {}
  for m in metrics:
    if m == "accuracy":
      out[m] = accuracy(pred, label)
    elif m == "matthews_correlation":
      out[m] = matthews_corrcoef(pred, label)
    elif m == "f1":
      out[m] = binary_f1(pred, label)
    elif m == "pearson":
      out[m] = pearson(pred, label)
    elif m == "spearman":
      out[m] = spearman(pred, label)
    else:
      raise ConfigError(f"Unknown metric {m!r}.")
  return out


def task_scores(task, logits: np.ndarray, labels: np.ndarray) -> dict:
  """Every metric of `task` from probe outputs (logits) and gold labels."""
  if task.kind == "tagging":
    pred = logits.argmax(-1)
    keep = labels != -100
    names = np.asarray(task.label_names)
    p = [list(names[pr[k]]) for pr, k in zip(pred, keep)]
    t = [list(names[lb[k]]) for lb, k in zip(labels, keep)]
    if "f1" in task.metrics:
      return entity_scores(p, t)
    return dict(accuracy=accuracy(pred[keep], labels[keep]))
  pred = logits[:, 0] if task.kind == "regression" else logits.argmax(-1)
  return classification_scores(task.metrics, pred, labels)
