"""Unit tests of the attention functions, against direct numpy computations."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from papa_jax import attention as attn

pytestmark = pytest.mark.unit


def _random(seed, b=3, h=4, l=7, d=5):
  rng = np.random.default_rng(seed)
  probs = rng.random((b, h, l, l)).astype(np.float32)
  probs /= probs.sum(-1, keepdims=True)
  lengths = np.array([l, 3, 1])[:b]
  mask = np.arange(l)[None] < lengths[:, None]
  values = rng.normal(size=(b, h, l, d)).astype(np.float32)
  return probs, mask, values


def _np_mask_and_normalize(p, m):
  out = np.zeros_like(p)
  for b in range(p.shape[0]):
    for h in range(p.shape[1]):
      for i in range(p.shape[2]):
        if not m[b, i]:
          continue
        row = p[b, h, i] * m[b]
        out[b, h, i] = row / max(np.abs(row).sum(), 1e-12)
  return out


class AttentionFunctionsTest(chex.TestCase, parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_mask_and_normalize_matches_numpy(self):
    probs, mask, _ = _random(0)
    got = self.variant(attn.mask_and_normalize)(probs, mask)
    chex.assert_shape(got, probs.shape)
    chex.assert_trees_all_close(got, _np_mask_and_normalize(probs, mask), atol=1e-6)
    # Padded queries and keys are exactly zero; real rows sum to one.
    got = np.asarray(got)
    assert np.all(got[1, :, 3:] == 0) and np.all(got[1, :, :, 3:] == 0)
    np.testing.assert_allclose(got[1, :, :3].sum(-1), 1.0, rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_mask_and_normalize_all_zero_rows_stay_zero(self):
    probs = np.zeros((1, 2, 4, 4), np.float32)
    mask = np.array([[True, True, False, False]])
    got = self.variant(attn.mask_and_normalize)(probs, mask)
    assert not np.any(np.isnan(got)) and np.all(np.asarray(got) == 0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_constant_context_equals_explicit_masked_product(self):
    _, mask, values = _random(1)
    rng = np.random.default_rng(2)
    const = rng.random((4, 7, 7)).astype(np.float32)
    const[0, :, 2] = 0.0  # A never co-observed cell column.
    const[1] *= rng.choice([-1.0, 1.0], size=(7, 7))  # Signed (effective) means.
    want = np.einsum("bhqk,bhkd->bhqd",
                     _np_mask_and_normalize(np.broadcast_to(const, (3, 4, 7, 7)), mask),
                     values)
    got = self.variant(attn.constant_context)(const, mask, np.swapaxes(values, 1, 2))
    chex.assert_shape(got, (3, 7, 4, 5))  # [B, L, H, D]
    chex.assert_trees_all_close(np.swapaxes(got, 1, 2), want, atol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_softmax_with_key_mask_ignores_pad_keys(self):
    rng = np.random.default_rng(3)
    scores = rng.normal(size=(3, 2, 7, 7)).astype(np.float32)
    _, mask, _ = _random(0)
    got = np.asarray(self.variant(attn.softmax_with_key_mask)(scores, mask))
    for b in range(3):
      n = mask[b].sum()
      e = np.exp(scores[b, :, :, :n] - scores[b, :, :, :n].max(-1, keepdims=True))
      np.testing.assert_allclose(got[b, :, :, :n], e / e.sum(-1, keepdims=True), rtol=1e-5)
      assert np.all(got[b, :, :, n:] == 0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_softmax_with_pair_mask_matches_masked_fill(self):
    rng = np.random.default_rng(4)
    scores = rng.normal(size=(3, 2, 7, 7)).astype(np.float32)
    _, mask, _ = _random(0)
    pm = mask[:, None, :, None] & mask[:, None, None, :]
    filled = np.where(pm, scores, np.finfo(np.float32).min)
    e = np.exp(filled - filled.max(-1, keepdims=True))
    got = self.variant(attn.softmax_with_pair_mask)(scores, mask)
    chex.assert_trees_all_close(got, e / e.sum(-1, keepdims=True), atol=1e-6)

  def test_merge_heads_restores_order(self):
    x = np.arange(2 * 5 * 3).reshape(2, 5, 3)
    parts = [((4, 1), x[:, [4, 1]]), ((0, 2, 3), x[:, [0, 2, 3]])]
    np.testing.assert_array_equal(attn.merge_heads(parts), x)
    y = np.swapaxes(x, 1, 2)
    parts = [((4, 1), y[:, :, [4, 1]]), ((0, 2, 3), y[:, :, [0, 2, 3]])]
    np.testing.assert_array_equal(attn.merge_heads(parts, axis=2), y)


  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(jnp.float32, jnp.bfloat16, jnp.float16)
  def test_fusion_barrier_is_an_exact_identity(self, dtype):
    x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 3, 5, 5)) * 1e3, dtype)
    x = x.at[0, 0, 0, :3].set(jnp.asarray([jnp.finfo(dtype).tiny, 1e-30, -0.0], dtype))
    got = self.variant(attn.fusion_barrier)(x)
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(x, np.float32))


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="checks XLA-CPU fusion")
def test_fusion_barrier_keeps_softmax_and_context_matmul_apart():
  """Without it, XLA-CPU fuses both attention matmuls into one slow kernel."""
  q, k, v = (jnp.asarray(np.random.default_rng(i).normal(size=(16, 64, 12, 32)), jnp.float32)
             for i in range(3))  # MiniLM heads, batch 16, length 64 (fused from batch 8)
  mask = jnp.ones((16, 64), bool)

  def block(q, k, v, mask, barrier):
    p = attn.softmax_with_key_mask(jnp.einsum("bqhd,bkhd->bhqk", q, k), mask)
    p = attn.fusion_barrier(p) if barrier else p
    return jnp.einsum("bhqk,bkhd->bqhd", p, v)

  def max_dots_per_computation(barrier):
    hlo = jax.jit(block, static_argnums=4).lower(q, k, v, mask, barrier).compile().as_text()
    counts, dots = [], 0
    for line in hlo.splitlines():
      if line.startswith("%") or line.startswith("ENTRY"):
        counts.append(dots)
        dots = 0
      dots += " dot(" in line
    return max(counts + [dots])

  assert max_dots_per_computation(barrier=True) == 1
  # The behaviour the barrier exists for; if a jaxlib stops fusing the two
  # matmuls, this documents it (and fusion_barrier may be removed).
  if max_dots_per_computation(barrier=False) == 1:
    pytest.skip("this jaxlib no longer fuses the two attention matmuls")


def test_override_validation_names_expected_shapes():
  good = np.zeros((2, 3, 5, 5), np.float32)
  heads = np.zeros((2, 3), bool)
  heads[0, 1] = True
  attn.AttentionOverride(constants=good, static_heads=heads).validate(2, 3, 5)
  with pytest.raises(ValueError, match=r"\[layers, heads\] = \(2, 4\)"):
    attn.AttentionOverride(constants=good, static_heads=heads).validate(2, 4, 5)
  with pytest.raises(ValueError, match=r"\[layers, heads, L, L\] = \(2, 3, 6, 6\)"):
    attn.AttentionOverride(constants=good, static_heads=heads).validate(2, 3, 6)
  with pytest.raises(ValueError, match="need `constants`"):
    attn.AttentionOverride(static_heads=heads).validate(2, 3, 5)
  with pytest.raises(ValueError, match="boolean"):
    attn.AttentionOverride(static_heads=np.zeros((2, 3), int))
  with pytest.raises(ValueError, match="gate_logits have shape"):
    attn.AttentionOverride(constants=good, gate_logits=np.zeros((3, 3))).validate(2, 3, 5)


def test_override_is_a_pytree_with_static_heads_in_the_structure():
  heads = np.eye(2, 3, dtype=bool)
  ov = attn.AttentionOverride(constants=jnp.ones((2, 3, 4, 4)), static_heads=heads)
  leaves, tree = jax.tree.flatten(ov)
  assert len(leaves) == 1
  again = jax.tree.unflatten(tree, leaves)
  assert again.static_heads == ov.static_heads
  other = attn.AttentionOverride(constants=jnp.ones((2, 3, 4, 4)), static_heads=~heads)
  assert jax.tree.structure(other) != tree
