"""The patching stage end to end on SST-2: substitution pairs and a pair file, an exact effect
that must equal the whole gap, and the per-head records."""

import json
import itertools
import os

import numpy as np
import pytest
import scipy.stats

from papa_jax import attention, reader, run
from papa_jax.analysis import patching_stage
from papa_jax.config import fields
from papa_jax.errors import ConfigError
from tests.testing import tiny_config


@pytest.mark.unit
def test_pair_interval_against_independent_bootstraps():
  """One seed: scipy's percentile bootstrap of the mean over pairs (within Monte Carlo error).
  Seeds only (every pair equal within a seed): the exact distribution of a mean of 3 seeds
  drawn with replacement (27 equally likely draws). A ratio: its point is the pooled ratio."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(1, 40, 2))
  point, low, high = patching_stage.pair_interval(x, n_boot=20000, level=0.9, seed=1)
  np.testing.assert_allclose(point, x[0].mean(0))
  for j in range(2):
    ref = scipy.stats.bootstrap((x[0, :, j],), np.mean, n_resamples=20000, confidence_level=0.9,
                                method="percentile", random_state=2).confidence_interval
    width = ref.high - ref.low
    assert abs(low[j] - ref.low) < 0.05 * width and abs(high[j] - ref.high) < 0.05 * width
  seeds = np.array([0.0, 1.0, 5.0])
  point, low, high = patching_stage.pair_interval(np.repeat(seeds[:, None], 30, 1), n_boot=20000,
                                                  level=0.8, seed=3)
  means = np.sort([np.mean(c) for c in itertools.product(seeds, repeat=3)])
  assert point == pytest.approx(2.0)
  eps = 1e-12  # 10% in each tail:
  assert means[2] - eps <= low <= means[3] + eps and means[23] - eps <= high <= means[24] + eps
  num, den = rng.random((2, 25, 3)), rng.integers(1, 4, size=(25, 3))
  point, low, high = patching_stage.pair_interval(num, den, n_boot=500, level=0.95, seed=0)
  np.testing.assert_allclose(point, num.mean(0).sum(0) / den.sum(0))
  assert (low <= point).all() and (point <= high).all()


SMALL = {"effective.max_examples": 16, "patching.max_pairs": 3, "run.batch_size": 8,
         "data.max_train_examples": 32, "probe.epochs": 1}


@pytest.mark.unit
def test_patching_sites_are_sites():
  assert set(fields.PATCHING_SITES) <= set(attention.SITES)


@pytest.mark.integration
def test_patching_stage_on_substitution_pairs(tmp_path, minilm_tokenizer):
  """Patching the clean embedding of the substituted position (the residual stream entering
  layer 0) makes the corrupt run the clean one: its exact effect is the whole clean - corrupt
  gap, for every pair, and patching any other position there changes nothing. The records
  are a [layers, heads] map per head site and a [layers, 1, 3] map per position site."""
  wd = str(tmp_path / "wd")
  run.run(tiny_config(tmp_path, stage="patching", **SMALL), wd)
  st = json.load(open(os.path.join(wd, "patching", "stats.json")))
  s = st["summary"]
  assert s["pair_source"] == "substitution rule" and s["pairs"] >= 2, s
  z = np.load(os.path.join(wd, "patching", "effects.npz"))
  changed = z["clean_ids"] != z["corrupt_ids"]
  assert (changed.sum(1) == 1).all()
  swap = patching_stage.substitution_ids(minilm_tokenizer)
  for c, k in zip(z["clean_ids"][changed], z["corrupt_ids"][changed]):
    assert swap[int(c)] == int(k)
  length = s["length"]
  assert list(z["seeds"]) == [42] and z["exact_residual_in"].shape[0] == 1  # One probe seed.
  z = {k: (v[0] if k in ("clean", "corrupt", "target_class") or k.startswith(("exact_", "atp_"))
           else v) for k, v in z.items()}
  # Every position real in some pair is patched: the PAPA layout's last [SEP] (L - 1) too.
  positions = z["positions"]
  real = np.flatnonzero(z["mask"].any(0))
  np.testing.assert_array_equal(positions, real)
  assert positions[-1] == z["mask"].shape[1] - 1 and length == len(positions) == s["length"]
  first = z["exact_residual_in"][:length]  # Layer 0's targets, one per patched position.
  gap = z["clean"] - z["corrupt"]
  pos = np.argmax(changed, 1)
  at = np.searchsorted(positions, pos)
  np.testing.assert_allclose(first[at, np.arange(len(pos))], gap, atol=2e-5)
  others = np.ones(first.shape, bool)
  others[at, np.arange(len(pos))] = False
  np.testing.assert_allclose(first[others], 0.0, atol=2e-5)
  for kind in ("exact", "atp", "grad_drop"):
    assert np.shape(st[f"{kind}_context"]) == (6, 12)
    assert np.shape(st[f"{kind}_residual_in"]) == (6, 1, 3)
  assert set(s["agreement"]) == {"context", "residual_in"}
  assert set(s["agreement"]["context"]) == {"atp", "grad_drop", "top", "targets",
                                           "targets_excluding_0"}
  assert (np.asarray(st["grad_drop_context"]) >= 0).all()
  np.testing.assert_allclose(s["gap"], gap.mean(), rtol=1e-6)
  assert s["gap_ci"][0] <= s["gap"] <= s["gap_ci"][1] and s["probe_seeds"] == [42]
  top = s["agreement"]["residual_in"]["top"][0]  # The largest |mean over pairs|.
  means = z["exact_residual_in"].mean(1)
  t = top["layer"] * length + int(np.searchsorted(positions, top["position"]))
  assert top["change"] == pytest.approx(means[t]) and abs(means[t]) == pytest.approx(
      np.abs(means).max())
  assert top["ci"][0] <= top["change"] <= top["ci"][1]
  assert top["excludes_0"] == (top["ci"][0] > 0 or top["ci"][1] < 0)
  changed_l0 = s["agreement"]["residual_in"]["classes"]["changed"][0]
  np.testing.assert_allclose(changed_l0["change"], st["exact_residual_in"][0][0][1], rtol=1e-6)
  assert os.path.exists(os.path.join(wd, "patching", "effects.png"))
  # Per-position records: each pair's change per layer and real token, its word pieces.
  tms = {m.name: m for m in reader.read_workdir(wd, with_means=False).token_maps}
  assert set(tms) == {f"{k}_residual_in" for k in ("exact", "atp", "grad_drop")}
  exact = tms["exact_residual_in"]
  assert exact.rows == tuple(f"layer {l}" for l in range(6)) and len(exact.examples) == len(pos)
  for i, ex in enumerate(exact.examples):
    mine = np.flatnonzero(z["mask"][i])  # Its real positions, the last [SEP] included.
    toks = minilm_tokenizer.convert_ids_to_tokens(z["clean_ids"][i, mine].tolist())
    assert toks[-1] == "[SEP]" and len(ex["tokens"]) == len(mine)
    swapped = minilm_tokenizer.convert_ids_to_tokens([int(z["corrupt_ids"][i, pos[i]])])[0]
    k = int(np.searchsorted(mine, pos[i]))
    assert ex["tokens"][k] == f"{toks[k]}→{swapped}"
    np.testing.assert_allclose(ex["values"], z["exact_residual_in"][:, i].reshape(
        6, length)[:, np.searchsorted(positions, mine)], rtol=1e-5, atol=1e-7)


@pytest.mark.integration
def test_patching_stage_reads_a_pair_file_and_names_bad_input(tmp_path):
  pairs = tmp_path / "pairs.csv"
  pairs.write_text("clean,corrupt\nthe film is good .,the film is bad .\n"
                   "a great cast,a terrible cast\n")
  wd = str(tmp_path / "wd")
  run.run(tiny_config(tmp_path, stage="patching", **SMALL, **{
      "patching.pairs": str(pairs), "patching.sites": ("context",), "papa.seeds": (42, 43)}), wd)
  st = json.load(open(os.path.join(wd, "patching", "stats.json")))
  s = st["summary"]
  assert s["pairs"] == 2 and s["pair_source"].endswith("pairs.csv (2 pairs)"), s
  assert set(s["agreement"]) == {"context"}
  # Two probe seeds: each its own probe and metric; the maps average over seeds and pairs.
  z = np.load(os.path.join(wd, "patching", "effects.npz"))
  assert list(z["seeds"]) == [42, 43] and z["exact_context"].shape == (2, 72, 2)
  assert not np.allclose(z["clean"][0], z["clean"][1])
  np.testing.assert_allclose(st["exact_context"], z["exact_context"].mean((0, 2)).reshape(6, 12),
                             rtol=1e-5, atol=1e-8)
  np.testing.assert_allclose(s["gap"], (z["clean"] - z["corrupt"]).mean(), rtol=1e-5)
  pairs.write_text("clean,corrupt\nthe film is good .,the film is not good .\n")
  with pytest.raises(Exception, match=r"pairs.csv:2: the clean text has 7 word pieces and the "
                                      r"corrupt 8"):
    run.run(tiny_config(tmp_path, stage="patching", **SMALL,
                        **{"patching.pairs": str(pairs), "overwrite": True}), str(tmp_path / "w2"))
  with pytest.raises(ConfigError, match=r"patching.sites=\('heads',\): use a non-empty subset"):
    run.run(tiny_config(tmp_path, stage="patching", **SMALL, **{"patching.sites": ("heads",)}),
            str(tmp_path / "w3"))
