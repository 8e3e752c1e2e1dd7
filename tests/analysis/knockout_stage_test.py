"""The knockout stage: batched windows and classes against a loop over the public API, and
the stage end to end on a real task."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import papa_jax as pj
from papa_jax import parallel, run
from papa_jax.analysis import knockout
from papa_jax.config import fields
from papa_jax.interventions import ABLATIONS, KNOCKOUT_RULES
from papa_jax.papa import constants
from papa_jax.probing import probes
from tests import testing
from tests.testing import tiny_config


@pytest.mark.unit
def test_config_name_lists_are_the_modules_own():
  assert fields.KNOCKOUT_CLASSES == knockout.CLASSES
  assert fields.KNOCKOUT_RULES == KNOCKOUT_RULES
  assert fields.ABLATIONS == ABLATIONS
  assert fields.VARIANTS == constants.VARIANTS
  assert knockout.windows(6, 2) == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]


@pytest.mark.integration
def test_punctuation_ids_of_a_wordpiece_vocabulary(minilm_tokenizer):
  ids = set(knockout.punctuation_ids(minilm_tokenizer))
  got = {t for t, i in minilm_tokenizer.get_vocab().items() if i in ids}
  assert {",", ".", "!", "##.", "(", "'"} <= got
  assert not {"the", "a1", "[CLS]", "[SEP]", "1"} & got


@pytest.mark.integration
def test_knockout_windows_batched_equal_the_full_encoder_loop(minilm, minilm_tokenizer,
                                                               sst2_dir):
  """`knock_window` (rows (example, class), the encoder started at the window from cached
  states) equals, per class, a full run of `pj.Knockout` from the first layer and the probe."""
  dev = testing.sst2_dev_sample(minilm_tokenizer, sst2_dir, longest=4, first=4)
  cfg = minilm.config
  probe = probes.SentenceProbe(2, cfg.hidden_size, 0.0)
  feats = jnp.stack(minilm.apply(dev.input_ids, dev.attention_mask).hidden_states, 1)
  pp = probe.init(jax.random.key(0), feats[:1], jnp.asarray(dev.attention_mask[:1]))["params"]
  blocked = knockout.blocked_edges(dev, minilm_tokenizer, knockout.CLASSES)
  assert blocked.shape == (len(dev), 6) + (dev.input_ids.shape[1],) * 2
  got = knockout.knock_window(cfg, probe, 2, 3, "renormalize", (minilm.params, pp, feats), dev,
                              blocked, parallel.make_mesh(1), 16)
  n = len(dev)
  stock = np.asarray(probe.apply({"params": pp}, feats, dev.attention_mask))
  for k in range(len(knockout.CLASSES)):
    out = minilm.apply(dev.input_ids, dev.attention_mask, override=pj.AttentionOverride.intervene(
        pj.Knockout(blocked[:, k], [2] * n, [3] * n)))
    want = probe.apply({"params": pp}, jnp.stack(out.hidden_states, 1), dev.attention_mask)
    np.testing.assert_allclose(got[k], np.asarray(want), atol=2e-5)
  assert np.abs(got - stock).max() > 1e-4  # Knocking out does change the outputs.


@pytest.mark.integration
def test_knockout_stage_writes_changes_with_intervals_as_a_per_head_record(tmp_path):
  """SPLADE-tiny on SST-2: every (window, class) has its change from the baseline, equal to
  the scores of the saved predictions' recomputation, a paired interval, and the record the
  explorer and the report list."""
  testing.require_model("splade_tiny")
  c = tiny_config(tmp_path, stage="knockout", **{"model.name": "splade_tiny",
                                                  "effective.max_examples": 24,
                                                  "report.n_boot": 200})
  wd = str(tmp_path / "wd")
  run.run(c, wd)
  stats = json.load(open(os.path.join(wd, "knockout", "stats.json"), encoding="utf-8"))
  s = stats["summary"]
  assert s["classes"] == list(knockout.CLASSES) and s["eval_examples"] == 24
  assert len(s["changes"]) == 2 * 6  # Two windows of one layer, six classes.
  change = np.asarray(stats["change"])
  assert change.shape == (2, 1, 6)
  for r in s["changes"]:
    assert r["change"] == change[r["first"], 0, knockout.CLASSES.index(r["key_class"])]
    lo, hi = r["ci"]
    assert lo <= r["change"] <= hi and r["within_noise"] == (lo <= 0 <= hi)
  wd_maps = pj.read_workdir(wd).head_maps
  assert [m.key for m in wd_maps if m.stage == "knockout"] == ["knockout/change"]
  assert os.path.exists(os.path.join(wd, "knockout", "change.png"))

