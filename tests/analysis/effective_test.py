"""Effective attention: properties on random matrices, a float64 oracle, the model."""

import chex
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import papa_jax as pj
from papa_jax.measures import effective as eff



def _case(seed, n=12, d=4, n_valid=None, batch=2):
  rng = np.random.default_rng(seed)
  A = rng.random((batch, n, n))
  n_valid = n if n_valid is None else n_valid
  mask = np.arange(n)[None] < np.array([n_valid] * batch)[:, None]
  A = np.where(mask[:, None, :], A, 0)
  A /= A.sum(-1, keepdims=True)
  T = rng.normal(size=(batch, n, d))
  return A, T, mask


def _oracle(A, T, mask):
  """float64 numpy: A[:, S] @ pinv(T[S]) @ T[S] on the valid block, 0 elsewhere."""
  out = np.zeros_like(A)
  for b in range(A.shape[0]):
    s = mask[b]
    P = T[b][s] @ np.linalg.pinv(T[b][s])
    out[b][np.ix_(s, s)] = A[b][np.ix_(s, s)] @ P
  return out


_jitted_effective = jax.jit(eff.effective_attention)


# Shapes from a small set, so that each compiles once: with frac they still reach n_valid
# below, at and above d, a single valid key, and padding (the cases the algebra tells apart).
@pytest.mark.unit
@hypothesis.given(seed=st.integers(0, 10**6), n=st.sampled_from([2, 7, 20]),
                  d=st.sampled_from([1, 4, 8]), frac=st.floats(0.1, 1.0))
def test_effective_properties_random(seed, n, d, frac):
  n_valid = max(1, int(round(frac * n)))
  A, T, mask = _case(seed, n, d, n_valid)
  with jax.enable_x64(True):  # Jitted: one compile per shape (eager equals jit: below).
    E, info = _jitted_effective(jnp.asarray(A), jnp.asarray(T), jnp.asarray(mask))
    E2, _ = _jitted_effective(E, jnp.asarray(T), jnp.asarray(mask))
    E, E2 = np.asarray(E), np.asarray(E2)
  Tm = np.where(mask[..., None], T, 0)
  # Output preservation: A_eff T == A T (on real keys).
  np.testing.assert_allclose(E @ Tm, np.where(mask[..., None], A @ Tm, 0), atol=1e-10)
  # Rows lie in col(T): projecting again changes nothing (idempotence).
  np.testing.assert_allclose(E2, E, atol=1e-10)
  # Pad rows and pad columns are exactly zero.
  assert np.all(E[~mask] == 0) and np.all(E.transpose(0, 2, 1)[~mask] == 0)
  # Pythagoras: ||A||^2 = ||A_eff||^2 + ||A_null||^2 on the valid block.
  Av = np.where(mask[:, :, None] & mask[:, None, :], A, 0)
  np.testing.assert_allclose((Av**2).sum((1, 2)), (E**2).sum((1, 2)) + ((Av - E)**2).sum((1, 2)),
                             rtol=1e-9)
  np.testing.assert_allclose(E, _oracle(A, T, mask), atol=1e-9)
  np.testing.assert_array_equal(np.asarray(info.rank), np.minimum(n_valid, d))


@pytest.mark.unit
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 1e-5)])
def test_effective_short_inputs_equal_attention(dtype, tol):
  A, T, mask = _case(0, n=16, d=8, n_valid=7)
  ctx = jax.enable_x64(dtype == np.float64)
  with ctx:
    E, info = eff.effective_attention(jnp.asarray(A, dtype), jnp.asarray(T, dtype), jnp.asarray(mask))
    np.testing.assert_allclose(np.asarray(E), np.where(mask[:, :, None], A, 0), atol=tol)
    assert np.all(np.asarray(info.null_dim) == 0)


@pytest.mark.unit
def test_effective_appending_padding_leaves_valid_block_unchanged():
  A, T, mask = _case(1, n=10, d=3)
  rng = np.random.default_rng(2)
  A_pad = np.zeros((2, 16, 16))
  A_pad[:, :10, :10] = A
  T_pad = np.concatenate([T, rng.normal(size=(2, 6, 3)) * 50], axis=1)
  m_pad = np.arange(16)[None] < 10
  m_pad = np.repeat(m_pad, 2, 0)
  with jax.enable_x64(True):
    E = np.asarray(eff.effective_attention(A, T, mask)[0])
    E_pad = np.asarray(eff.effective_attention(A_pad, T_pad, m_pad)[0])
  np.testing.assert_allclose(E_pad[:, :10, :10], E, atol=1e-12)


@pytest.mark.unit
def test_effective_invariant_to_invertible_mixing_and_output_projection():
  A, T, mask = _case(3, n=14, d=4)
  rng = np.random.default_rng(4)
  R = rng.normal(size=(4, 4)) + 4 * np.eye(4)
  W_O = rng.normal(size=(4, 9))  # Full row rank d_v x d_model.
  with jax.enable_x64(True):
    E = np.asarray(eff.effective_attention(A, T, mask)[0])
    np.testing.assert_allclose(np.asarray(eff.effective_attention(A, T @ R, mask)[0]), E, atol=1e-10)
    np.testing.assert_allclose(np.asarray(eff.effective_attention(A, T @ W_O, mask)[0]), E, atol=1e-10)


@pytest.mark.unit
@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
@pytest.mark.parametrize("method", ["qr_svd", "svd"])
def test_effective_rank_deficient_rank_at_every_scale(scale, method):
  rng = np.random.default_rng(5)
  T = (rng.normal(size=(40, 3)) @ rng.normal(size=(3, 8)) * scale).astype(np.float32)[None]
  _, info = eff.range_basis(jnp.asarray(T), method=method)
  assert int(info.rank[0]) == 3 and int(info.null_dim[0]) == 37


@pytest.mark.unit
def test_invalid_effective_shapes_and_half_precision():
  with pytest.raises(ValueError, match="do not match"):
    eff.effective_attention(jnp.ones((2, 5, 5)), jnp.ones((2, 6, 3)))
  with pytest.raises(ValueError, match="key_mask shape"):
    eff.effective_attention(jnp.ones((2, 5, 5)), jnp.ones((2, 5, 3)), jnp.ones((2, 4), bool))
  with pytest.raises(ValueError, match="half precision"):
    eff.range_basis(jnp.ones((5, 3), jnp.bfloat16))


@pytest.mark.unit
class EffectiveVariantsTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_effective_jit_equals_eager(self):
    A, T, mask = _case(6, n=20, d=5)
    E, _ = self.variant(eff.effective_attention)(A.astype(np.float32), T.astype(np.float32), mask)
    chex.assert_shape(E, A.shape)
    chex.assert_trees_all_close(E, _oracle(A, T, mask).astype(np.float32), atol=2e-5)


@pytest.mark.integration
def test_effective_model_override_keeps_outputs_on_real_weights(minilm, minilm_tokenizer):
  """Replacing every head by its effective attention leaves the model's output unchanged."""
  text = ("the film 's thoughtful , reflective tone , its quietly affecting performances and "
          "its refusal to tie things up neatly make it one of the year 's most satisfying "
          "movies , even if the final act drags a little and the score is too insistent .")
  enc = minilm_tokenizer([text, "short one ."], padding="max_length", max_length=64,
                         truncation=True, return_tensors="np")
  ids, mask = enc["input_ids"], enc["attention_mask"]
  d = minilm.config.dim_per_head
  assert mask[0].sum() > d  # The null space is non-trivial for the long example.
  ref = minilm.apply(ids, mask, capture_attention=True, capture_values=True)
  out = minilm.apply(ids, mask, override=pj.AttentionOverride.intervene(pj.EffectiveAttention()))
  m = mask.astype(bool)
  for a, b in zip(out.hidden_states, ref.hidden_states):
    assert np.abs(np.asarray(a)[m] - np.asarray(b)[m]).max() <= 1e-4
  key_mask = np.broadcast_to(m[:, None, :], ref.attentions[0].shape[:-1])
  null = eff.null_attention(ref.attentions[0], ref.values[0], jnp.asarray(key_mask))
  norm = np.linalg.norm(np.asarray(null)[0], axis=(-1, -2)) / np.linalg.norm(
      np.asarray(ref.attentions[0])[0], axis=(-1, -2))
  assert norm.min() > 0.05  # A large part of attention does not reach the output.
  assert np.abs(np.asarray(null)[1]).max() < 1e-5  # Short example: nothing is lost.
