"""The effective-attention analysis: statistics vs numpy, sharding, the stage, PAPA-eff."""

import json

import numpy as np
import pytest

from papa_jax import preemption, run
from papa_jax.analysis import effective_stats as stats
from tests.testing import (analysis_means, sigterm_during_batch,
                           sst2_dev_sample, tiny_config)


@pytest.fixture(scope="module")
def long_batch(minilm_tokenizer, sst2_dir):
  enc = sst2_dev_sample(minilm_tokenizer, sst2_dir, longest=5, first=6)
  cats = stats.category_ids(enc.input_ids, enc.attention_mask, minilm_tokenizer)
  return dict(enc.arrays(), categories=cats)


def _numpy_stats(minilm, arrays, layer):
  """Per-example statistics with float64 numpy (pinv projection), averaged."""
  out = minilm.apply(arrays["input_ids"], arrays["attention_mask"],
                     token_type_ids=arrays["token_type_ids"], capture_attention=True,
                     capture_values=True)
  A_all = np.asarray(out.attentions[layer], np.float64)
  V_all = np.asarray(out.values[layer], np.float64)
  acc = {k: [] for k in ("mass_raw", "mass_eff", "corr", "null_ratio", "js")}
  for b in range(len(A_all)):
    s = arrays["attention_mask"][b].astype(bool)
    cat = arrays["categories"][b][s]
    per = {k: [] for k in acc}
    for h in range(A_all.shape[1]):
      A = A_all[b, h][np.ix_(s, s)]
      T = V_all[b, h][s]
      E = A @ T @ np.linalg.pinv(T)
      per["mass_raw"].append([A[:, cat == c].sum(1).mean() for c in range(4)])
      per["mass_eff"].append([E[:, cat == c].sum(1).mean() for c in range(4)])
      per["corr"].append(np.corrcoef(A.ravel(), E.ravel())[0, 1])
      per["null_ratio"].append(np.linalg.norm(A - E) / np.linalg.norm(A))
      q = np.maximum(E, 0)
      q /= q.sum(1, keepdims=True)
      m = (A + q) / 2
      kl = lambda p: np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1) / m), 0), 1)
      per["js"].append(np.mean(0.5 * kl(A) + 0.5 * kl(q)))
    for k in acc:
      acc[k].append(per[k])
  return {k: np.mean(np.asarray(v), 0) for k, v in acc.items()}


@pytest.mark.integration
def test_effective_stats_match_numpy(minilm, long_batch):
  st = analysis_means(stats.EffectiveStats(minilm.config.dim_per_head), minilm, long_batch)
  assert st["count/all"] == 11 and 0 < st["count/long"] < 11
  for layer in (0, 3):
    want = _numpy_stats(minilm, long_batch, layer)
    for k, tol in (("mass_raw", 1e-5), ("mass_eff", 1e-4), ("corr", 1e-4),
                   ("null_ratio", 1e-4), ("js", 1e-4)):
      np.testing.assert_allclose(st[f"{k}/all"][layer], want[k], atol=tol, err_msg=k)


@pytest.mark.integration
def test_effective_stats_8_devices_equal_1(minilm, long_batch):
  analysis = stats.EffectiveStats(minilm.config.dim_per_head)
  # 11 examples in batches of 8: the last batch is padded.
  outs = [analysis_means(analysis, minilm, long_batch, devices=n, batch_size=8) for n in (1, 8)]
  for k in outs[0]:
    np.testing.assert_allclose(outs[0][k], outs[1][k], atol=2e-5, err_msg=k)


@pytest.mark.slow
def test_effective_stage_writes_stats_and_figures_and_resumes(tmp_path, minilm, monkeypatch):
  del minilm
  c = tiny_config(tmp_path, stage="effective", **{
      "data.max_length": 64, "data.papa_layout": False, "effective.max_examples": 24,
      "run.batch_size": 8})
  # Preempted while its second of three batches is added, then resumed from there.
  with sigterm_during_batch(monkeypatch, 2) as added:
    with pytest.raises(preemption.Preempted, match="after batch 2"):
      run.run(c, str(tmp_path / "resumed"))
    preemption.reset()  # A rerun is a new process: no request pending.
    with np.load(tmp_path / "resumed" / "effective" / "partial.partial.npz") as z:
      assert int(z["position"]) == 2  # Landed mid-pass.
    added.clear()
    resumed = run.run(c, str(tmp_path / "resumed"))
    assert len(added) == 1  # Only the last batch was computed again.
  summary = run.run(c, str(tmp_path / "wd"))
  assert resumed == summary
  st_resumed = json.load(open(tmp_path / "resumed" / "effective" / "stats.json"))
  out = tmp_path / "wd" / "effective"
  for f in ("stats.json", "stats.csv", "mass_heatmaps.png", "agreement_heatmaps.png",
            "example_attention.png"):
    assert (out / f).exists(), f
  st = json.load(open(out / "stats.json"))
  assert st["summary"]["examples"] == 24 == summary["examples"]
  assert np.asarray(st["mass_raw/all"]).shape == (6, 12, 4)
  np.testing.assert_allclose(np.asarray(st["mass_raw/all"]).sum(-1), 1.0, atol=1e-4)
  assert len(open(out / "stats.csv").read().splitlines()) == 1 + 2 * 72
  for k, v in st.items():
    if k.endswith(("/all", "/long")):
      np.testing.assert_array_equal(np.asarray(st_resumed[k]), np.asarray(v), err_msg=k)
  assert not (out / "partial.partial.npz").exists()


@pytest.mark.integration
def test_invalid_effective_figure_head_does_not_exist(tmp_path, minilm):
  del minilm
  c = tiny_config(tmp_path, stage="effective", **{"figures.head": 12})
  with pytest.raises(ValueError, match="figures.head=12 does not exist"):
    run.run(c, str(tmp_path / "wd"))


@pytest.mark.slow
def test_papa_effective_variant_reported_beside_raw(tmp_path, minilm):
  """PAPA with mean *effective* attention; at 32 tokens (<= head dim) means coincide."""
  del minilm
  c = tiny_config(tmp_path, **{"papa.variants": ("raw", "effective"), "papa.fractions": (0.0, 1.0),
                               "probe.epochs": 1})
  rows = run.run(c, str(tmp_path / "wd"))
  assert [(r["variant"], r["static_heads"]) for r in rows] == [
      ("raw", 0), ("raw", 72), ("effective", 72)]
  raw = np.load(tmp_path / "wd" / "means" / "means_raw.npz")["avgs"]
  eff = np.load(tmp_path / "wd" / "means" / "means_effective.npz")["avgs"]
  np.testing.assert_allclose(eff, raw, atol=1e-5)  # Every input is shorter than 32.
  md = open(tmp_path / "wd" / "results.md").read()
  assert "| effective |" in md and "| raw |" in md
