"""MPNet against Hugging Face PyTorch: buckets, long inputs, head classes, the real model.

The generic parity, override and mixing tests cover MPNet through `hf_oracle.ARCHS`;
these add what only MPNet has: its relative-position buckets over every offset, inputs
long enough to reach every bucket, and the real all-mpnet-base-v2
(419 MB: `python -m papa_jax.convert.fetch mpnet`; skipped when absent, as in CI).
"""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import papa_jax as pj
from papa_jax.models import relative_bias
from tests import hf_oracle, testing


@pytest.fixture(scope="module")
def tiny(random_hf):
  return random_hf("mpnet")[0]


@pytest.mark.unit
def test_parity_mpnet_buckets_match_torch():
  torch = pytest.importorskip("torch")
  from transformers.models.mpnet.modeling_mpnet import MPNetEncoder
  delta = np.arange(-2000, 2001)[None]  # Query minus key; HF takes key minus query.
  for buckets, max_distance in [(32, 128), (64, 256), (16, 32), (8, 20), (32, 512)]:
    ours = relative_bias.relative_position_bucket(delta, buckets, max_distance)
    ref = MPNetEncoder.relative_position_bucket(torch.tensor(-delta), buckets, max_distance)
    np.testing.assert_array_equal(ours, ref.numpy(), err_msg=f"{buckets}, {max_distance}")


@pytest.mark.unit
def test_parity_mpnet_long_inputs_reach_every_bucket(tiny):
  """Offsets up to 127 use every row of the shared table (but row 16, a negative zero
  offset that T5's buckets never produce); HF agrees on padded batches."""
  model = pj.load_pretrained(str(tiny))
  c = model.config
  assert c.relative_bias_buckets == 32 and c.position_ids == "from_padding"
  rows = np.unique(relative_bias.bucket_index(c, c.max_length))
  np.testing.assert_array_equal(rows, np.delete(np.arange(32), 16))
  ids, mask = hf_oracle.padded_batch(c.vocab_size, [c.max_length, 100, 3], c.max_length, 1)
  hf = hf_oracle.load_hf(tiny)
  # Jitted: this length is the family tests' only one, so op by op would compile every op.
  def fwd(p, i, m):
    return model.module.apply({"params": p}, i, m, capture_attention=True)
  ours = jax.jit(fwd)(model.params, ids, mask)
  rel, _, att = hf_oracle.max_diffs(ours, *hf_oracle.run_hf(hf, ids, mask), mask)
  assert rel <= 1e-4 and att <= 1e-5, (rel, att)
  with jax.enable_x64(True):  # Traced apart: float64 parameters, int64 ids.
    p64 = jax.tree.map(lambda x: jnp.asarray(x, jnp.float64), model.params)
    ours64 = jax.tree.map(np.asarray, jax.jit(fwd)(p64, jnp.asarray(ids), jnp.asarray(mask)))
  _, ab, att = hf_oracle.max_diffs(ours64, *hf_oracle.run_hf(hf.double(), ids, mask), mask,
                                   real_only=False)
  assert ab <= 1e-9 and att <= 1e-9, (ab, att)


@pytest.mark.unit
def test_parity_mpnet_head_classes_load_their_base(tmp_path):
  """MPNetForMaskedLM (prefix `mpnet.`, an LM head) converts to the base model."""
  torch = pytest.importorskip("torch")
  import transformers as tr
  config, _ = hf_oracle.spec("mpnet")
  config._attn_implementation = "eager"
  torch.manual_seed(1)
  tr.MPNetForMaskedLM(config).eval().save_pretrained(str(tmp_path))
  model = pj.load_pretrained(str(tmp_path))
  hf = tr.AutoModelForMaskedLM.from_pretrained(str(tmp_path), attn_implementation="eager")
  ids, mask = hf_oracle.padded_batch(config.vocab_size, [20, 9], 20, 1)
  ours = model.apply(ids, mask, capture_attention=True)
  rel, _, att = hf_oracle.max_diffs(ours, *hf_oracle.run_hf(hf.eval().mpnet, ids, mask), mask)
  assert rel <= 1e-4 and att <= 1e-5, (rel, att)


@pytest.mark.unit
def test_invalid_mpnet_bias_table_shape_is_named(tiny, tmp_path):
  w = load_file(str(tiny / "model.safetensors"))
  w["encoder.relative_attention_bias.weight"] = np.zeros((16, 4), np.float32)
  save_file(w, str(tmp_path / "model.safetensors"))
  (tmp_path / "config.json").write_text((tiny / "config.json").read_text())
  with pytest.raises(ValueError, match=r"relative_bias.*checkpoint \(16, 4\) vs config \(32, 4\)"):
    pj.load_pretrained(str(tmp_path))


@pytest.mark.unit
@pytest.mark.parametrize("fused", ["0", "1"])
def test_override_mpnet_fused_attention_carries_the_bias(tiny, monkeypatch, fused):
  """The fused dot_product_attention path (accelerators) adds the same bias, with and
  without constant heads."""
  monkeypatch.setenv("PAPA_FUSED_ATTENTION", fused)
  model = pj.load_pretrained(str(tiny))
  c = model.config
  ids, mask = hf_oracle.family_batch(c, seed=5)
  b = 3  # 25 real tokens of 40: the constants are this example's own attention.
  ref = model.apply(ids, mask, capture_attention=True)
  heads = np.zeros((c.num_layers, c.num_heads), bool)
  heads[:, 1] = True
  constants = jnp.stack([a[b] for a in ref.attentions])
  m = mask[b].astype(bool)
  for ov in (None, pj.AttentionOverride.constant(constants, heads)):
    out = model.apply(ids, mask, override=ov)
    for x, y in zip(out.hidden_states, ref.hidden_states, strict=True):
      np.testing.assert_allclose(np.asarray(x)[b, m], np.asarray(y)[b, m], atol=3e-5)
    if ov is not None:  # The constants do act: the other examples' outputs change.
      assert np.abs(np.asarray(out.hidden_states[-1])[:b]
                    - np.asarray(ref.hidden_states[-1])[:b]).max() > 1e-3


REAL_BATCH = ["The quick brown fox jumps over the lazy dog.", "A man is eating food."]
# shared/models.md, all-mpnet-base-v2: HF MPNetModel, eager, float32, max_length 16.
REAL_IDS = [[0, 2000, 4252, 2833, 4423, 14527, 2062, 2000, 13975, 3903, 1016, 2, 1, 1, 1, 1],
            [0, 1041, 2162, 2007, 5987, 2837, 1016, 2, 1, 1, 1, 1, 1, 1, 1, 1]]
REAL_H0 = [[-0.126980, -0.0621138, 0.0460667, -0.0392163],
           [0.101347, -0.0937932, -0.0138647, 0.112953]]
REAL_CLS = [(0.306971, 0.306436), (0.334050, 0.328645)]  # cls_valid, cls_all.
REAL_SUMSQ00 = [8.29799, 11.6750]
REAL_COSINES = {"A man is eating a piece of bread.": 0.660113,
                "The stock market fell sharply on Monday.": -0.0221087,
                "A woman is playing the violin.": -0.0877430}


@pytest.fixture(scope="module")
def real_mpnet():
  return pj.load_pretrained(testing.require_model("mpnet"))


@pytest.mark.integration
def test_parity_real_mpnet_reference_values(real_mpnet):
  """The published HF reference numbers, no torch needed."""
  tok = real_mpnet.tokenizer()
  enc = tok(REAL_BATCH, padding="max_length", max_length=16, truncation=True,
            return_tensors="np")
  assert enc["input_ids"].tolist() == REAL_IDS and "token_type_ids" not in enc
  mask = enc["attention_mask"]
  out = real_mpnet.apply(enc["input_ids"], mask, capture_attention=True)
  h = np.asarray(out.last_hidden_state)
  A = np.stack([np.asarray(a) for a in out.attentions])  # [L, B, H, q, k]
  for b in range(2):
    np.testing.assert_allclose(h[b, 0, :4], REAL_H0[b], atol=2e-6)
    valid = A[:, b][:, :, mask[b].astype(bool), 0].mean()
    np.testing.assert_allclose([valid, A[:, b, :, :, 0].mean()], REAL_CLS[b], atol=2e-6)
    np.testing.assert_allclose(A[0, b, 0].sum(), 16.0, rtol=1e-6)
    np.testing.assert_allclose((A[0, b, 0] ** 2).sum(), REAL_SUMSQ00[b], atol=6e-5)  # 6 digits.
  texts = ["A man is eating food."] + list(REAL_COSINES)
  enc = tok(texts, padding=True, return_tensors="np")
  hs = np.asarray(real_mpnet.apply(enc["input_ids"], enc["attention_mask"]).last_hidden_state)
  m = enc["attention_mask"][..., None]
  emb = (hs * m).sum(1) / m.sum(1)
  emb /= np.linalg.norm(emb, axis=-1, keepdims=True)
  np.testing.assert_allclose(emb[1:] @ emb[0], list(REAL_COSINES.values()), atol=1e-5)


@pytest.mark.integration
def test_parity_real_mpnet_against_pytorch(real_mpnet):
  """Hidden states <= 1e-4 of each layer's largest value and attentions <= 1e-5 at real
  tokens (float32), every position in float64; lengths 3-128 reach every bucket."""
  pytest.importorskip("torch")
  pytest.importorskip("transformers")
  text = ("an unflinching , complex portrait of a modern israel that is rarely seen "
          "on-screen , with layers of meaning and a great many more words to pass ")
  sents = REAL_BATCH + ["a", text * 5]
  enc = real_mpnet.tokenizer()(sents, padding="max_length", truncation=True, max_length=128,
                               return_tensors="np")
  ids, mask = enc["input_ids"], enc["attention_mask"]
  assert mask.sum(1).min() == 3 and mask.sum(1).max() == 128
  hf = hf_oracle.load_hf(real_mpnet.model_dir)
  ours = real_mpnet.apply(ids, mask, capture_attention=True)
  rel, _, att = hf_oracle.max_diffs(ours, *hf_oracle.run_hf(hf, ids, mask), mask)
  assert rel <= 1e-4 and att <= 1e-5, (rel, att)
  _, ab, att = hf_oracle.max_diffs(hf_oracle.ours_f64(real_mpnet, ids, mask),
                          *hf_oracle.run_hf(hf.double(), ids, mask), mask, real_only=False)
  assert ab <= 1e-9 and att <= 1e-9, (ab, att)
