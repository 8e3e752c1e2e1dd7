"""The patching stage end to end on SST-2: substitution pairs and a pair file, an exact effect
that must equal the whole gap, and the per-head records."""

import json
import os

import numpy as np
import pytest

from papa_jax import attention, reader, run
from papa_jax.analysis import patching_stage
from papa_jax.config import fields
from papa_jax.errors import ConfigError
from tests.testing import tiny_config

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
  first = z["exact_residual_in"][:length]  # Layer 0's targets: positions 0..length-1.
  gap = z["clean"] - z["corrupt"]
  pos = np.argmax(changed, 1)
  np.testing.assert_allclose(first[pos, np.arange(len(pos))], gap, atol=2e-5)
  others = np.ones(first.shape, bool)
  others[pos, np.arange(len(pos))] = False
  np.testing.assert_allclose(first[others], 0.0, atol=2e-5)
  for kind in ("exact", "atp", "grad_drop"):
    assert np.shape(st[f"{kind}_context"]) == (6, 12)
    assert np.shape(st[f"{kind}_residual_in"]) == (6, 1, 3)
  assert set(s["agreement"]) == {"context", "residual_in"}
  assert set(s["agreement"]["context"]) == {"atp", "grad_drop"}
  assert (np.asarray(st["grad_drop_context"]) >= 0).all()
  assert os.path.exists(os.path.join(wd, "patching", "effects.png"))
  # Per-position records: each pair's change per layer and real token, its word pieces.
  tms = {m.name: m for m in reader.read_workdir(wd, with_means=False).token_maps}
  assert set(tms) == {f"{k}_residual_in" for k in ("exact", "atp", "grad_drop")}
  exact = tms["exact_residual_in"]
  assert exact.rows == tuple(f"layer {l}" for l in range(6)) and len(exact.examples) == len(pos)
  for i, ex in enumerate(exact.examples):
    n = int(z["mask"][i].sum())
    toks = minilm_tokenizer.convert_ids_to_tokens(z["clean_ids"][i, :n].tolist())
    swapped = minilm_tokenizer.convert_ids_to_tokens([int(z["corrupt_ids"][i, pos[i]])])[0]
    assert ex["tokens"][pos[i]] == f"{toks[pos[i]]}→{swapped}" and len(ex["tokens"]) == n
    np.testing.assert_allclose(ex["values"], z["exact_residual_in"][:, i].reshape(
        6, length)[:, :n], rtol=1e-5, atol=1e-7)


@pytest.mark.integration
def test_patching_stage_reads_a_pair_file_and_names_bad_input(tmp_path):
  pairs = tmp_path / "pairs.csv"
  pairs.write_text("clean,corrupt\nthe film is good .,the film is bad .\n"
                   "a great cast,a terrible cast\n")
  wd = str(tmp_path / "wd")
  run.run(tiny_config(tmp_path, stage="patching", **SMALL, **{"patching.pairs": str(pairs),
                                                            "patching.sites": ("context",)}), wd)
  s = json.load(open(os.path.join(wd, "patching", "stats.json")))["summary"]
  assert s["pairs"] == 2 and s["pair_source"].endswith("pairs.csv (2 pairs)"), s
  assert set(s["agreement"]) == {"context"}
  pairs.write_text("clean,corrupt\nthe film is good .,the film is not good .\n")
  with pytest.raises(Exception, match=r"pairs.csv:2: the clean text has 7 word pieces and the "
                                      r"corrupt 8"):
    run.run(tiny_config(tmp_path, stage="patching", **SMALL,
                        **{"patching.pairs": str(pairs), "overwrite": True}), str(tmp_path / "w2"))
  with pytest.raises(ConfigError, match=r"patching.sites=\('heads',\): use a non-empty subset"):
    run.run(tiny_config(tmp_path, stage="patching", **SMALL, **{"patching.sites": ("heads",)}),
            str(tmp_path / "w3"))
