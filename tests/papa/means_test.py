"""Attention means: against a direct numpy computation, sharded vs single device."""

import jax
import numpy as np
import pytest

from papa_jax import convert, parallel, preemption
from papa_jax.workdir import resume
from papa_jax.data import preprocess, readers, tasks
from papa_jax.papa import means as means_lib
from tests.testing import sigterm_during_batch

pytestmark = pytest.mark.integration

L = 32


@pytest.fixture(scope="module")
def sst2_rows(minilm_tokenizer, sst2_dir):
  task = tasks.get_task("sst2")
  recs = list(readers.read_split(task, str(sst2_dir), "validation"))[:61]
  return preprocess.encode(task, recs, minilm_tokenizer, L)


def _means(minilm, data, num_devices, batch_size, **kw):
  mesh = parallel.make_mesh(num_devices)
  return means_lib.accumulate(minilm.config, minilm.params, data, mesh, batch_size=batch_size,
                              **kw)


def test_mean_equals_numpy_over_hf_attentions(minilm, sst2_rows):
  """Oracle: per-example attentions from Hugging Face PyTorch, averaged in numpy."""
  pytest.importorskip("torch")
  from tests import hf_oracle
  data = sst2_rows.take(np.arange(20))
  hf = hf_oracle.load_hf(minilm.model_dir)
  _, attns = hf_oracle.run_hf(hf, data.input_ids.astype(np.int64),
                              data.attention_mask.astype(np.int64),
                              data.token_type_ids.astype(np.int64))
  A = np.stack(attns, 1).astype(np.float64)  # [B, layers, H, L, L]
  m = data.attention_mask.astype(np.float64)
  pair = m[:, :, None] * m[:, None, :]
  num = np.einsum("blhqk,bqk->lhqk", A, pair)
  den = pair.sum(0)
  want = np.where(den > 0, num / np.where(den > 0, den, 1), 0.0)
  state = _means(minilm, data, 1, 8)
  assert state.num_examples == 20
  np.testing.assert_allclose(state.counts, den)
  np.testing.assert_allclose(state.averages(), want, atol=1e-5)


def test_mean_never_coobserved_cells_are_zero_and_rows_unnormalised(minilm, sst2_rows):
  state = _means(minilm, sst2_rows, 1, 16)
  avg = state.averages()
  never = state.counts == 0
  assert never.any() and np.all(avg[:, :, never] == 0)
  assert not np.allclose(avg[0, 0, 0].sum(), 1.0, atol=1e-3)  # No row normalisation.
  assert state.num_examples == 61


def test_shard_mean_8_devices_equals_1_device(minilm, sst2_rows):
  assert jax.device_count() == 8, "conftest sets 8 CPU devices"
  one = _means(minilm, sst2_rows, 1, 16)  # 61 examples: last batch padded.
  eight = _means(minilm, sst2_rows, 8, 16)
  assert one.num_examples == eight.num_examples == 61
  np.testing.assert_array_equal(one.counts, eight.counts)
  assert np.abs(one.averages() - eight.averages()).max() <= 1e-6


def test_mean_resume_from_partial_sums_equals_one_pass(minilm, sst2_rows, tmp_path,
                                                       monkeypatch):
  full = _means(minilm, sst2_rows, 1, 16)
  partial = str(tmp_path / "means.partial.npz")
  with sigterm_during_batch(monkeypatch, 2):  # The second of four batches.
    with pytest.raises(preemption.Preempted, match="after batch 2"):
      _means(minilm, sst2_rows, 1, 16, partial=partial, run_key="key", checkpoint_every=100)
  saved = resume.load(partial, "key")
  assert saved.position == 2 and int(saved.arrays["examples"]) == 32  # Landed mid-pass.
  assert resume.load(partial, "other-run") is None
  resumed = _means(minilm, sst2_rows, 1, 16, partial=partial, run_key="key")
  np.testing.assert_array_equal(resumed.sums, full.sums)
  np.testing.assert_array_equal(resumed.counts, full.counts)
  assert resumed.num_examples == full.num_examples == 61


def test_mean_file_roundtrip_and_invalid_files(minilm, sst2_rows, tmp_path):
  state = _means(minilm, sst2_rows.take(np.arange(8)), 1, 8)
  fp = minilm.fingerprint
  path = str(tmp_path / "means.npz")
  means_lib.save_means(path, state, dict(model="minilm", model_fingerprint=fp, max_length=L))
  m = means_lib.load_means(path, fingerprint=fp, max_length=L)
  np.testing.assert_array_equal(m.avgs, state.averages())
  assert m.metadata["num_examples"] == 8 and m.metadata["format"] == means_lib.FORMAT
  with pytest.raises(means_lib.MeansFileError, match="max_length=32, but this run uses max_length=64"):
    means_lib.load_means(path, fingerprint=fp, max_length=64)
  with pytest.raises(means_lib.MeansFileError, match="another model"):
    means_lib.load_means(path, fingerprint="0" * 16, max_length=L)
  raw = open(path, "rb").read()
  (tmp_path / "trunc.npz").write_bytes(raw[: len(raw) // 2])
  with pytest.raises(means_lib.MeansFileError, match="corrupt or truncated"):
    means_lib.load_means(str(tmp_path / "trunc.npz"))
  with pytest.raises(means_lib.MeansFileError, match="does not exist"):
    means_lib.load_means(str(tmp_path / "none.npz"))


def test_model_fingerprint_distinguishes_weights_and_precision(minilm):
  other = jax.tree.map(lambda x: x, minilm.params)
  other["layer_0"]["output"]["bias"] = other["layer_0"]["output"]["bias"] + 1e-3
  assert (convert.params_fingerprint(minilm.config, minilm.params)
          != convert.params_fingerprint(minilm.config, other))
  bf16 = convert.Pretrained(minilm.config.replace(compute_dtype="bfloat16"), minilm.params,
                            minilm.model_dir)
  assert bf16.fingerprint != minilm.fingerprint
  again = convert.Pretrained(minilm.config, minilm.params, minilm.model_dir)
  assert again.fingerprint == minilm.fingerprint
