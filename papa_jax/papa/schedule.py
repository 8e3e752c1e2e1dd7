"""Which heads become constant: the head ranking and the static-head counts."""

from __future__ import annotations

import json
from typing import Sequence

import numpy as np

from papa_jax.workdir import storage, rules as workdir
from papa_jax.workdir.layout import Layout
from papa_jax.errors import ConfigError, IncompleteWorkdir, ResultFileError

PAPER_FRACTIONS = (0.0, 0.5, 0.875, 0.9375, 1.0)


def static_head_counts(total_heads: int, fractions: Sequence[float]) -> list[int]:
  """`floor(f * total)` for each fraction, deduplicated, ascending.

  144 heads -> 0, 72, 126, 135, 144; 384 -> 0, 192, 336, 360, 384.
  """
  bad = [f for f in fractions if not 0.0 <= float(f) <= 1.0]
  if bad:
    raise ConfigError(f"papa.fractions must lie in [0, 1]; got {bad}.")
  return sorted({int(np.floor(float(f) * total_heads + 1e-9)) for f in fractions})


def needs_ranking(counts: Sequence[int], total_heads: int) -> bool:
  """Whether a schedule needs the head ranking (a count strictly between 0 and all)."""
  return any(0 < k < total_heads for k in counts)


def ranking_from_lambdas(lambdas: np.ndarray) -> list[list[int]]:
  """Heads by ascending gate logit: the least input-dependent first.

  Ties break by (layer, head) order (a stable sort), unlike the original's
  unspecified quicksort order.
  """
  num_heads = lambdas.shape[1]
  order = np.argsort(np.asarray(lambdas).reshape(-1), kind="stable")
  return [[int(i // num_heads), int(i % num_heads)] for i in order]


def head_mask_from_ranking(ranking: Sequence[Sequence[int]], k: int, num_layers: int,
                           num_heads: int) -> np.ndarray:
  """Boolean `[layers, heads]` marking the first k `(layer, head)` pairs."""
  if not 0 <= k <= len(ranking):
    raise ValueError(f"k={k} outside [0, {len(ranking)}].")  # caller's argument
  mask = np.zeros((num_layers, num_heads), dtype=bool)
  for layer, head in ranking[:k]:
    if not (0 <= layer < num_layers and 0 <= head < num_heads):
      raise ValueError(f"Head ({layer}, {head}) does not exist in a model with "
                       f"{num_layers} layers and {num_heads} heads.")  # caller's argument
    mask[layer, head] = True
  return mask


def static_heads(ranking: Sequence[Sequence[int]] | None, k: int, num_layers: int,
                 num_heads: int) -> np.ndarray:
  """The heads constant in a run with k constant heads (all of them for k = total)."""
  if k == num_layers * num_heads:
    return np.ones((num_layers, num_heads), bool)
  return head_mask_from_ranking(ranking or [], k, num_layers, num_heads)


def save_ranking(layout: Layout, lambdas: np.ndarray) -> str:
  """Writes a workdir's gate logits and the ranking they give (atomically); returns its path."""
  with workdir.atomic_write(layout.lambdas, "wb") as f:
    np.save(f, np.asarray(lambdas, np.float32))
  with workdir.atomic_write(layout.ranking) as f:
    json.dump(ranking_from_lambdas(lambdas), f)
  return layout.ranking


def load_ranking(path: str, num_layers: int, num_heads: int) -> list[list[int]]:
  """Reads `sorted_heads.json`, checking it is a permutation of this model's heads."""
  if not storage.exists(path):
    raise IncompleteWorkdir(f"{path} does not exist; run the 'sort' stage first.")
  try:
    with storage.open(path) as f:
      ranking = json.load(f)
  except json.JSONDecodeError as e:
    raise ResultFileError(f"{path} is not valid JSON ({e}); rerun the 'sort' stage.") from e
  return check_ranking(ranking, num_layers, num_heads, path)


def check_ranking(ranking, num_layers: int, num_heads: int, where: str) -> list[list[int]]:
  """`ranking` as `[[layer, head], ...]`, checked to be a permutation of the model's heads."""
  pairs = {tuple(p) for p in ranking}
  want = {(l, h) for l in range(num_layers) for h in range(num_heads)}
  if len(ranking) != len(want) or pairs != want:
    raise ResultFileError(f"{where} is not a ranking of this model's {num_layers}x{num_heads} "
                          "heads.")
  return [list(p) for p in ranking]
