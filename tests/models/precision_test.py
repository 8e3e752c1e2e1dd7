"""Mixed precision (bf16 matmuls, float32 everything else) against float32, on real weights.

Bounds measured on all-MiniLM-L6-v2, 64 SST-2 dev sentences at 64 tokens
(README, Performance): hidden states relative error <= 0.84% (Frobenius, real
tokens), attention probabilities <= 0.073 absolute, attention means <= 0.0047.
"""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

import papa_jax as pj
from papa_jax.data import preprocess, readers, tasks

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pair(minilm, minilm_tokenizer, sst2_dir):
  task = tasks.get_task("sst2")
  recs = list(readers.read_split(task, str(sst2_dir), "validation"))[:64]
  data = preprocess.encode(task, recs, minilm_tokenizer, 64)
  bf16 = dataclasses.replace(minilm, config=minilm.config.replace(compute_dtype="bfloat16"))
  return minilm, bf16, data


def test_precision_bf16_hidden_states_and_attention_within_bounds(pair):
  f32, bf16, d = pair
  a = f32.apply(d.input_ids, d.attention_mask, capture_attention=True)
  b = bf16.apply(d.input_ids, d.attention_mask, capture_attention=True)
  m = d.attention_mask.astype(bool)
  assert b.hidden_states[-1].dtype == jnp.float32 and b.attentions[0].dtype == jnp.float32
  for x, y in zip(a.hidden_states[1:], b.hidden_states[1:]):
    x, y = np.asarray(x)[m], np.asarray(y)[m]
    rel = np.linalg.norm(x - y) / np.linalg.norm(x)
    assert 1e-4 < rel < 0.015, rel  # bf16 is really used, and close.
  for x, y in zip(a.attentions, b.attentions):
    assert np.abs(np.asarray(x) - np.asarray(y)).max() < 0.1
    np.testing.assert_allclose(np.asarray(y).sum(-1)[m[:, None].repeat(12, 1)], 1.0, atol=1e-5)


def test_precision_bf16_means_within_bound(pair):
  f32, bf16, d = pair
  a = pj.attention_means(f32, d, batch_size=32)
  b = pj.attention_means(bf16, d, batch_size=32)
  assert a.sums.dtype == np.float64 and b.avgs.dtype == np.float32
  diff = np.abs(a.avgs - b.avgs).max()
  assert 1e-5 < diff < 0.01, diff


def test_precision_float32_setting_is_bitwise_the_default(pair):
  f32, _, d = pair
  explicit = dataclasses.replace(f32, config=f32.config.replace(compute_dtype="float32"))
  np.testing.assert_array_equal(np.asarray(f32.apply(d.input_ids, d.attention_mask)[0][-1]),
                                np.asarray(explicit.apply(d.input_ids,
                                                          d.attention_mask)[0][-1]))
