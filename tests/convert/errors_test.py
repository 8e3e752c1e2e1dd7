"""Bad input to the converters gets a clear error, never a silent model."""

import json
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import papa_jax as pj
from papa_jax.convert import hf_config
from tests.testing import require_shared


@pytest.fixture
def tiny_bert(tmp_path):
  src = require_shared("fixtures", "tiny-random", "bert", "BertModel")
  dst = tmp_path / "bert"
  shutil.copytree(src, dst)
  return dst


def test_invalid_missing_directory(tmp_path):
  with pytest.raises(FileNotFoundError, match="does not exist"):
    pj.load_pretrained(str(tmp_path / "nope"))


def test_invalid_directory_without_config(tmp_path):
  with pytest.raises(FileNotFoundError, match="no config.json"):
    pj.load_pretrained(str(tmp_path))


def test_invalid_directory_without_weights(tiny_bert):
  (tiny_bert / "model.safetensors").unlink()
  with pytest.raises(FileNotFoundError, match="model.safetensors or pytorch_model.bin"):
    pj.load_pretrained(str(tiny_bert))


def test_invalid_unsupported_model_type(tiny_bert):
  cfg = json.loads((tiny_bert / "config.json").read_text())
  cfg["model_type"] = "gpt2"
  (tiny_bert / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(ValueError, match="Unsupported model_type 'gpt2'.*supported"):
    pj.load_pretrained(str(tiny_bert))


def test_invalid_unsupported_architecture_option():
  cfg = dict(model_type="bert", vocab_size=10, hidden_size=8, num_hidden_layers=1,
             num_attention_heads=2, intermediate_size=8, max_position_embeddings=8,
             position_embedding_type="relative_key")
  with pytest.raises(ValueError, match="position_embedding_type='relative_key'"):
    hf_config.encoder_config_from_hf(cfg)


@pytest.mark.parametrize("field,value,match", [
    ("relative_attention_num_buckets", 64, "relative_attention_num_buckets=64"),
    ("pad_token_id", 0, "MPNet pad_token_id=0"),
    ("hidden_act", "quick_gelu", "hidden_act='quick_gelu'"),
    ("is_decoder", True, "is_decoder=True"),
])
def test_invalid_unsupported_mpnet_variants(field, value, match):
  cfg = dict(model_type="mpnet", vocab_size=10, hidden_size=8, num_hidden_layers=1,
             num_attention_heads=2, intermediate_size=8, max_position_embeddings=12,
             relative_attention_num_buckets=32, pad_token_id=1)
  c = hf_config.encoder_config_from_hf(cfg)
  assert (c.relative_bias_buckets, c.pad_token_id, c.type_vocab_size) == (32, 1, 0)
  with pytest.raises(ValueError, match=match):
    hf_config.encoder_config_from_hf({**cfg, field: value})


def test_invalid_relative_bias_flags():
  base = dict(vocab_size=10, hidden_size=8, num_layers=1, num_heads=2, intermediate_size=8,
              max_position_embeddings=12)
  with pytest.raises(ValueError, match="relative_bias_buckets=3: an even number >= 4"):
    pj.EncoderConfig(**base, relative_bias_buckets=3)
  with pytest.raises(ValueError, match="relative_bias_max_distance=8 must exceed"):
    pj.EncoderConfig(**base, relative_bias_buckets=32, relative_bias_max_distance=8)
  with pytest.raises(ValueError, match="needs attention='dot'"):
    pj.EncoderConfig(**base, relative_bias_buckets=32, attention="disentangled")
  # Fingerprints recorded before the flags existed stay valid: absent while off.
  assert "relative_bias_buckets" not in pj.EncoderConfig(**base).architecture_dict()
  assert pj.EncoderConfig(**base, relative_bias_buckets=32).architecture_dict()[
      "relative_bias_max_distance"] == 128


def test_invalid_missing_and_unexpected_keys(tiny_bert):
  w = load_file(str(tiny_bert / "model.safetensors"))
  w.pop("encoder.layer.1.output.dense.weight")
  w["encoder.layer.1.mystery.weight"] = np.zeros(3, np.float32)
  save_file(w, str(tiny_bert / "model.safetensors"))
  with pytest.raises(ValueError) as e:
    pj.load_pretrained(str(tiny_bert))
  assert "encoder.layer.1.output.dense.weight" in str(e.value)
  assert "encoder.layer.1.mystery.weight" in str(e.value)


def test_invalid_checkpoint_does_not_match_config(tiny_bert):
  cfg = json.loads((tiny_bert / "config.json").read_text())
  cfg["intermediate_size"] = 40  # The weights have 37.
  (tiny_bert / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(ValueError, match="shapes do not match"):
    pj.load_pretrained(str(tiny_bert))
  cfg["intermediate_size"], cfg["num_hidden_layers"] = 37, 3
  (tiny_bert / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(ValueError, match="missing keys.*encoder.layer.2"):
    pj.load_pretrained(str(tiny_bert))


def test_invalid_corrupt_weights(tiny_bert):
  (tiny_bert / "model.safetensors").write_bytes(b"\x00garbage")
  with pytest.raises(ValueError, match="Could not read safetensors"):
    pj.load_pretrained(str(tiny_bert))


def test_invalid_hub_name_offline_names_local_alternative(monkeypatch):
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  with pytest.raises(FileNotFoundError, match="local directory"):
    pj.load_pretrained("no-such-org/no-such-model")


def test_invalid_length_beyond_position_embeddings(tiny_bert):
  model = pj.load_pretrained(str(tiny_bert))
  ids = jnp.ones((1, model.config.max_position_embeddings + 1), jnp.int32)
  with pytest.raises(ValueError, match="exceeds this model's maximum of 64"):
    model.apply(ids)


def test_invalid_mask_shape(tiny_bert):
  model = pj.load_pretrained(str(tiny_bert))
  with pytest.raises(ValueError, match="attention_mask shape"):
    model.apply(jnp.ones((2, 8), jnp.int32), jnp.ones((2, 7), jnp.int32))
