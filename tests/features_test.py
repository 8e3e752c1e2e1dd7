"""Feature caching: same results as computing the encoder every step; budget refusal."""

import jax
import numpy as np
import pytest
from papa_jax import features, metrics, parallel, probes, train
from papa_jax.attention import AttentionOverride
from papa_jax.data import preprocess, readers, tasks
from tests.testing import optimizer_config


@pytest.fixture(scope="module")
def small(minilm_tokenizer, sst2_dir):
  task = tasks.get_task("sst2")
  recs = list(readers.read_split(task, str(sst2_dir), "validation"))
  enc = lambda rs: preprocess.encode(task, rs, minilm_tokenizer, 32)
  return task, enc(recs[:80]), enc(recs[80:120])


@pytest.mark.slow
@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("cache_dir", [False, True])
def test_cached_probe_equals_uncached(minilm, small, static, cache_dir, tmp_path):
  task, tr, ev = small
  cfg = minilm.config
  override = None
  if static:
    override = AttentionOverride.constant(
        np.full((cfg.num_layers, cfg.num_heads, 32, 32), 1 / 32, np.float32))
  encoder = train.FrozenEncoder(minilm.params, override, cfg, feature_dtype="bfloat16")
  mesh = parallel.make_mesh(-1)
  fit_cfg = train.FitConfig(epochs=3, batch_size=16, eval_batch_size=16, seed=42)
  score = lambda logits: metrics.task_scores(task, logits, ev.labels)

  def fit(train_data, eval_data):
    probe = probes.SentenceProbe(2, cfg.hidden_size, 0.1)
    state, hist, _ = train.fit("t", probe, encoder, train.make_optimizer(optimizer_config()),
                               fit_cfg, train_data, eval_data, score, mesh)
    return state, hist

  state_u, hist_u = fit(tr, ev)
  path = lambda s: str(tmp_path / f"{s}.npy") if cache_dir else ""
  ftr = features.compute(encoder, tr, mesh, 16, path("train"))
  fev = features.compute(encoder, ev, mesh, 16, path("eval"))
  assert ftr.features.shape == (80, 7, 32, 384)
  assert str(ftr.features.dtype) == "bfloat16"
  state_c, hist_c = fit(ftr, fev)
  for a, b in zip(hist_u, hist_c):
    assert a["accuracy"] == pytest.approx(b["accuracy"], abs=1 / 40 + 1e-9)  # <= 1 example.
    assert a["train_loss"] == pytest.approx(b["train_loss"], rel=2e-3)
  for a, b in zip(jax.tree.leaves(state_u.params), jax.tree.leaves(state_c.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-4, rtol=2e-3)


def test_invalid_cache_over_budget_is_refused():
  n = features.cache_bytes(67349, 13, 64, 768, "bfloat16")
  assert n == 67349 * 13 * 64 * 768 * 2
  with pytest.raises(features.CacheTooLarge, match=r"needs 80.1. GiB, over the budget run.cache_max_gb=8"):
    features.check_budget(n, 8.0, "SST-2 train")
  features.check_budget(n, 100.0, "SST-2 train")


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_means_pass_features_equal_the_feature_pass_bitwise(minilm, small, dtype):
  """The means pass's forward doubles as the baseline's feature pass (one fewer pass)."""
  from papa_jax.papa import means as means_lib
  _, tr, _ = small
  mesh = parallel.make_mesh(-1)
  state = means_lib.accumulate(minilm.config, minilm.params, tr, mesh, batch_size=16,
                               feature_dtype=dtype)
  want = features.compute(train.FrozenEncoder(minilm.params, None, minilm.config,
                                              feature_dtype=dtype), tr, mesh, 16)
  assert state.features.dtype == want.features.dtype and state.num_examples == 80
  np.testing.assert_array_equal(state.features.view(np.uint8), want.features.view(np.uint8))
  plain = means_lib.accumulate(minilm.config, minilm.params, tr, mesh, batch_size=16)
  np.testing.assert_array_equal(plain.sums, state.sums)  # The means are unchanged.
