"""Which heads become constant first: PAPA's gates, and the controls a reviewer asks for.

An ordering ranks every (layer, head), most constant-like first; the probe
stage makes the first k of it constant, exactly as it does with PAPA's
ranking. `papa.orderings` chooses them:
  * "lambda": PAPA's learned gates, ascending (the sort stage; unchanged);
  * "random": `papa.random_draws` seeded permutations (`random_0`, ...), the
    null curve;
  * "entropy", "variance", "kl": input-dependence scores from the means pass's
    one-pass sums (`shared/spec/context_mixing.md` §8): high entropy, low
    variance around the mean, low KL of the rows to the mean rows come first;
  * "gradient": Michel et al. (2019)'s head importance, `E_b |dL_b / d xi_bh|`
    with `xi` a per-example gate on each head's output, through the baseline
    probe (k = 0, the first probe seed) on the sorting run's train subset;
    least important first;
  * "ablation": the ablation stage's uniform replacement, smallest score drop
    first (run stage=ablation before).
The orderings stage (`papa/ordering_stage.py`) writes `orderings/<name>.json`
(ranking, scores, how the scores order); PAPA's own stays `sort/sorted_heads.json`.
"""

from __future__ import annotations


import numpy as np

from papa_jax.config import schema as config_schema
from papa_jax.workdir import storage, rules as workdir
from papa_jax.papa import means, schedule
from papa_jax.stage import Setup
from papa_jax.errors import IncompleteWorkdir

# Which end of each score is constant-like ("ascending": low scores first).
DIRECTIONS = {"entropy": "descending", "variance": "ascending", "kl": "ascending",
              "gradient": "ascending", "ablation": "ascending", "lambda": "ascending"}


def names(config) -> tuple[str, ...]:
  """`papa.orderings` expanded: "random" becomes `random_0` ... `random_{draws-1}`."""
  out = []
  for name in config_schema.orderings(config):
    if name == "random":
      out += [f"random_{d}" for d in range(config.papa.random_draws)]
    else:
      out.append(name)
  return tuple(out)


def ranking_from_scores(scores: np.ndarray, direction: str) -> list[list[int]]:
  """Heads by score (`direction` "ascending": low first), ties in (layer, head) order."""
  s = np.asarray(scores, np.float64)
  return schedule.ranking_from_lambdas(s if direction == "ascending" else -s)


def random_ranking(num_layers: int, num_heads: int, draw: int, seed: int) -> list[list[int]]:
  """A seeded permutation of every head (`seed`: the config's `data.subsample_seed`)."""
  order = np.random.default_rng([seed, 7919, draw]).permutation(num_layers * num_heads)
  return [[int(i // num_heads), int(i % num_heads)] for i in order]


def input_dependence(m: means.Means, path: str = "") -> dict[str, np.ndarray]:
  """Entropy, variance and mean KL per head `[layers, heads]` from one-pass sums (§8).

  With pair counts n, S1 = sums, S2 = sums of A^2, S3 = sums of A log A, and
  C = S1 / n PAPA's constant: entropy `-sum S3 / sum_i n_ii` (nats per real
  query row); variance `sum (S2 - S1^2 / n) / sum max(n - 1, 0)`; KL
  `sum (S3 - S1 log C) / sum_i n_ii`, the mean over real query rows of the
  generalised KL of a row to the mean row on that example's real keys.
  """
  n, s1 = m.counts, m.sums
  s2, s3 = m.extra("sums_sq", path), m.extra("sums_xlogx", path)
  rows = max(float(np.trace(n)), 1.0)
  seen = n > 0
  c = np.where(seen, s1 / np.where(seen, n, 1.0), 0.0)
  q = np.where(seen, s2 - s1 ** 2 / np.where(seen, n, 1.0), 0.0)
  j = np.where(c > 0, s3 - s1 * np.log(np.where(c > 0, c, 1.0)), 0.0)
  return dict(entropy=-s3.sum((-1, -2)) / rows,
              variance=q.sum((-1, -2)) / max(float(np.maximum(n - 1, 0).sum()), 1.0),
              kl=j.sum((-1, -2)) / rows)


def load(setup: Setup, name: str) -> list[list[int]] | None:
  """The ranking of an ordering in this workdir (None for lambda when no ranking is needed)."""
  mc = setup.model.config
  if name == "lambda":
    path = setup.layout.ranking
    return schedule.load_ranking(path, mc.num_layers, mc.num_heads) if storage.exists(
        path) else None
  path = setup.layout.ordering(name)
  if not storage.exists(path):
    raise IncompleteWorkdir(f"{path} does not exist; run the 'orderings' stage first.")
  return schedule.check_ranking(workdir.read_json(path)["ranking"], mc.num_layers,
                                mc.num_heads, path)
