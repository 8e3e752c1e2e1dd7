"""Converted encoders vs Hugging Face PyTorch (the oracle).

float32: hidden states at real tokens <= 1e-4, attention rows of real queries
<= 1e-5. Pad-query rows are ill-conditioned in float32 (HF float32 itself
differs from HF float64 there by ~2e-4 on MiniLM), so all positions are checked
in float64 instead, to 1e-9.
"""

import numpy as np
import pytest

import papa_jax as pj
from tests import hf_oracle

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Attention probing with PAPA.",
    "a",
    "an unflinching , complex portrait of a modern israel that is rarely seen "
    "on-screen , with layers of meaning and a great many more words to pass "
    "thirty-two word pieces .",
]


def _compare(ours, ref_hidden, ref_attn, mask, hid_tol, att_tol, real_only):
  m = mask.astype(bool)
  assert len(ours.hidden_states) == len(ref_hidden)
  assert len(ours.attentions) == len(ref_attn)
  for a, b in zip(ours.hidden_states, ref_hidden):
    diff = np.abs(np.asarray(a, np.float64) - b)
    diff = diff[m] if real_only else diff
    assert diff.max() <= hid_tol, diff.max()
  for a, b in zip(ours.attentions, ref_attn):
    diff = np.abs(np.asarray(a, np.float64) - b)
    if real_only:
      diff = diff[np.broadcast_to(m[:, None, :, None], diff.shape)]
    assert diff.max() <= att_tol, diff.max()


@pytest.mark.integration
@pytest.mark.parametrize("checkpoint", ["minilm", "sre"])
def test_parity_real_bert_weights(checkpoint, minilm, minilm_tokenizer):
  if checkpoint == "sre":
    import importlib.util
    spec = importlib.util.find_spec("sre_embedding_model")
    if spec is None:
      pytest.skip("sre-embedding-model not installed")
    model = pj.load_pretrained(list(spec.submodule_search_locations)[0] + "/model_weights")
    assert not np.allclose(model.params["layer_0"]["output"]["kernel"],
                           minilm.params["layer_0"]["output"]["kernel"])
  else:
    model = minilm
  enc = minilm_tokenizer(SENTENCES, padding="max_length", truncation=True,
                         max_length=48, return_tensors="np")
  ids, mask, tt = enc["input_ids"], enc["attention_mask"], enc["token_type_ids"]
  assert mask.sum(1).min() < 8 and mask.sum(1).max() > model.config.dim_per_head
  hf = hf_oracle.load_hf(model.model_dir)
  ref_h, ref_a = hf_oracle.run_hf(hf, ids, mask, tt)
  ours = model.apply(ids, mask, token_type_ids=tt, capture_attention=True)
  _compare(ours, ref_h, ref_a, mask, 1e-4, 1e-5, real_only=True)
  ref_h, ref_a = hf_oracle.run_hf(hf.double(), ids, mask, tt)
  _compare(hf_oracle.ours_f64(model, ids, mask, token_type_ids=tt), ref_h, ref_a, mask,
           1e-9, 1e-9, real_only=False)


@pytest.mark.integration
def test_parity_minilm_reference_embedding(minilm, minilm_tokenizer):
  """Mean-pooled, normalised embedding equals the published reference values."""
  enc = minilm_tokenizer(["The quick brown fox jumps over the lazy dog."], return_tensors="np")
  assert list(enc["input_ids"][0, :8]) == [101, 1996, 4248, 2829, 4419, 14523, 2058, 1996]
  h = np.asarray(minilm.apply(enc["input_ids"], enc["attention_mask"]).last_hidden_state)[0]
  emb = h.mean(0)
  emb /= np.linalg.norm(emb)
  np.testing.assert_allclose(emb[:4], [0.04393, 0.05893, 0.04818, 0.07755], atol=1e-5)


# Every architecture from safetensors, the torch-pickle path for three.
@pytest.mark.parametrize("arch,fmt", [
    hf_oracle.by_path(a, "safetensors") for a in hf_oracle.ARCHS] + [
        pytest.param(a, "bin", marks=pytest.mark.integration)
        for a in ("roberta", "deberta", "deberta-v3")])
def test_parity_random_hf_models(arch, fmt, tmp_path, random_hf):
  if fmt == "safetensors":  # The session's copy, which other family tests share.
    tmp_path, model = random_hf(arch)
  else:
    hf_oracle.save_random(arch, tmp_path, safe=False)
    model = pj.load_pretrained(str(tmp_path))
  files = {p.name for p in tmp_path.iterdir()}
  assert ("model.safetensors" in files) == (fmt == "safetensors")
  ids, mask = hf_oracle.family_batch(model.config)
  tt = None
  if model.config.type_vocab_size > 1:
    tt = (np.arange(40)[None] >= 12).astype(np.int64) * mask
  hf = hf_oracle.load_hf(tmp_path)
  ref_h, ref_a = hf_oracle.run_hf(hf, ids, mask, tt)
  ours = model.apply(ids, mask, token_type_ids=tt, capture_attention=True)
  _compare(ours, ref_h, ref_a, mask, 1e-4, 1e-5, real_only=True)
  if model.config.local_window:
    _compare_f64_unpadded(model, hf.double(), ids, mask)
    return
  ref_h, ref_a = hf_oracle.run_hf(hf.double(), ids, mask, tt)
  # HF's DebertaLayerNorm (v1) computes in float32 even in a float64 model; HF ModernBERT
  # rounds queries and keys to float32 for its rotation, and both rotary families take
  # cos/sin from float32 angles (torch's float32 cos, 1 ulp from numpy's).
  tol = {"deberta": 2e-6, "modernbert": 1e-7}.get(model.config.family, 1e-9)
  _compare(hf_oracle.ours_f64(model, ids, mask, token_type_ids=tt), ref_h, ref_a, mask,
           tol, tol, real_only=False)


def _compare_f64_unpadded(model, hf64, ids, mask):
  """float64 at the real tokens of each example run alone by HF: HF ModernBERT's eager
  softmax runs in float32, where a float64 finfo.min becomes -inf, so a padded query with
  no real key in its window gets NaN (and spreads it) in a float64 HF model. Ours on the
  padded batch must agree at real tokens (pad keys are masked, positions start at 0)."""
  ours = hf_oracle.ours_f64(model, ids, mask)
  for b, n in enumerate(mask.sum(1)):
    ref_h, ref_a = hf_oracle.run_hf(hf64, ids[b:b + 1, :n], mask[b:b + 1, :n])
    for a, r in zip(ours.hidden_states, ref_h, strict=True):
      np.testing.assert_allclose(a[b, :n], r[0], atol=1e-7, rtol=0)
    for a, r in zip(ours.attentions, ref_a, strict=True):
      np.testing.assert_allclose(a[b, :, :n, :n], r[0], atol=1e-7, rtol=0)


@pytest.mark.unit
def test_parity_deberta_v2_log_buckets_match_torch():
  from transformers.models.deberta_v2 import modeling_deberta_v2 as hf_v2
  from papa_jax.models import deberta
  rel = np.arange(-300, 301)[None]
  for buckets, max_pos in [(16, 64), (256, 512), (32, 128)]:
    ours = deberta.log_bucket_position(rel, buckets, max_pos)
    ref = hf_v2.make_log_bucket_position(torch.tensor(rel), buckets, max_pos).numpy()
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.unit
def test_family_representatives_follow_their_rule():
  """The families that tests of by-construction invariants run on are the first of each code
  path and of each layer layout: a family with a new path joins them or this fails."""
  paths = {arch: hf_oracle.code_path(arch) for arch in hf_oracle.ARCHS}

  def first_of_each(key):
    seen = {}
    for arch in hf_oracle.ARCHS:
      seen.setdefault(key(paths[arch]), arch)
    return tuple(seen.values())
  assert hf_oracle.ONE_PER_PATH == first_of_each(lambda path: path)
  assert hf_oracle.LAYOUTS == first_of_each(lambda path: path[-1])  # The norm placement.
