"""ALBERT against Hugging Face PyTorch: shared layers, the embedding mapping, head classes.

The generic parity, override, capture and mixing tests cover ALBERT through
`hf_oracle.ARCHS` ("albert", "albert-groups"); these add what only ALBERT has: layers that
share parameters by group (copied per layer), the embedding mapping that exists even when
embedding_size equals hidden_size, its task-head checkpoints, and its refusals.
"""

import json

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import papa_jax as pj
from papa_jax.convert import hf_config
from tests import hf_oracle

pytestmark = pytest.mark.unit

BASE = dict(model_type="albert", vocab_size=10, hidden_size=8, num_hidden_layers=3,
            num_attention_heads=2, intermediate_size=8, max_position_embeddings=12,
            embedding_size=4)


@pytest.fixture(scope="module")
def groups_dir(tmp_path_factory):
  pytest.importorskip("torch")
  path = tmp_path_factory.mktemp("albert_groups")
  hf_oracle.save_random("albert-groups", path)
  return path


def test_albert_layer_groups_follow_hf_formula():
  """Layer i uses group int(i / (layers / groups)), then its inner sub-layers in turn."""
  groups = hf_config.albert_layer_groups
  assert groups({**BASE, "num_hidden_groups": 2, "inner_group_num": 2}) == (
      (0, 0), (0, 1), (0, 0), (0, 1), (1, 0), (1, 1))
  assert [g for g, _ in groups({**BASE, "num_hidden_layers": 12, "num_hidden_groups": 5})] == [
      0, 0, 0, 1, 1, 2, 2, 2, 3, 3, 4, 4]
  assert hf_config.shared_layers(BASE) == ((0, 0), (0, 0), (0, 0))
  assert hf_config.shared_layers({**BASE, "model_type": "bert"}) is None
  c = hf_config.encoder_config_from_hf({**BASE, "inner_group_num": 2})
  assert (c.num_layers, c.embed_dim, c.embedding_projection, c.hidden_act) == (
      6, 4, "after_dropout", "gelu_new")


def test_parity_albert_shared_layers_are_copies(groups_dir):
  """Flat layers that share a (group, sub-layer) hold identical parameters, others not."""
  model = pj.load_pretrained(str(groups_dir))
  p = model.params
  same = jax.tree.map(np.array_equal, p["layer_0"], p["layer_2"])
  assert all(jax.tree.leaves(same))
  for other in ("layer_1", "layer_4"):
    assert not np.array_equal(p["layer_0"]["intermediate"]["kernel"],
                              p[other]["intermediate"]["kernel"])


def test_parity_albert_mapping_without_factorisation(tmp_path):
  """embedding_size == hidden_size: HF still applies embedding_hidden_mapping_in."""
  torch = pytest.importorskip("torch")
  import transformers as tr
  config = tr.AlbertConfig(**hf_oracle.COMMON, embedding_size=64)
  config._attn_implementation = "eager"
  torch.manual_seed(2)
  tr.AlbertModel(config).eval().save_pretrained(str(tmp_path))
  model = pj.load_pretrained(str(tmp_path))
  assert model.params["embeddings"]["embed_proj"]["kernel"].shape == (64, 64)
  ids, mask = hf_oracle.padded_batch(120, [16, 5], 16, 0)
  ours = model.apply(ids, mask, capture_attention=True)
  ref = hf_oracle.run_hf(hf_oracle.load_hf(tmp_path), ids, mask)
  rel, _, att = hf_oracle.max_diffs(ours, *ref, mask)
  assert rel <= 1e-4 and att <= 1e-5, (rel, att)


@pytest.mark.parametrize("head", ["AlbertForMaskedLM", "AlbertForPreTraining"])
def test_parity_albert_head_classes_load_their_base(tmp_path, head):
  """`albert.` prefix, `predictions.*` and `sop_classifier.*` heads: the base model loads."""
  torch = pytest.importorskip("torch")
  import transformers as tr
  config, _ = hf_oracle.spec("albert-groups")
  config._attn_implementation = "eager"
  torch.manual_seed(3)
  hf = getattr(tr, head)(config).eval()
  hf.save_pretrained(str(tmp_path))
  keys = load_file(str(tmp_path / "model.safetensors"))
  assert any(k.startswith("albert.encoder.") for k in keys)
  assert any(k.startswith("predictions.") for k in keys)
  model = pj.load_pretrained(str(tmp_path))
  ids, mask = hf_oracle.padded_batch(config.vocab_size, [20, 9], 20, 0)
  rel, _, att = hf_oracle.max_diffs(model.apply(ids, mask, capture_attention=True),
                        *hf_oracle.run_hf(hf.albert, ids, mask), mask)
  assert rel <= 1e-4 and att <= 1e-5, (rel, att)


@pytest.mark.parametrize("field,value,match", [
    ("num_hidden_groups", 4, r"num_hidden_groups=4: an integer >= 1 and <= num_hidden_layers=3"),
    ("num_hidden_groups", 0, r"num_hidden_groups=0"),
    ("inner_group_num", 0, r"inner_group_num=0: an integer >= 1\."),
    ("inner_group_num", 1.5, r"inner_group_num=1.5"),
    ("position_embedding_type", "relative_key", r"position_embedding_type='relative_key'"),
    ("hidden_act", "quick_gelu", r"hidden_act='quick_gelu'"),
    ("add_cross_attention", True, r"add_cross_attention=True"),
    ("num_attention_heads", 3, r"hidden_size 8 is not a multiple of num_heads 3"),
])
def test_invalid_unsupported_albert_variants(field, value, match):
  hf_config.encoder_config_from_hf(BASE)
  with pytest.raises(ValueError, match=match):
    hf_config.encoder_config_from_hf({**BASE, field: value})


def _with_config(src, dst, **changes):
  """A copy of the model folder `src` whose config.json says `changes`."""
  dst.mkdir()
  (dst / "model.safetensors").write_bytes((src / "model.safetensors").read_bytes())
  cfg = json.loads((src / "config.json").read_text())
  (dst / "config.json").write_text(json.dumps({**cfg, **changes}))
  return dst


@pytest.mark.parametrize("changes,match", [
    # Each names the checkpoint tensor and both shapes (or the keys).
    (dict(embedding_size=40), r"embeddings/word_embeddings/embedding <- embeddings."
     r"word_embeddings.weight \(120, 48\): checkpoint \(120, 48\) vs config \(120, 40\)"),
    (dict(hidden_size=32, num_attention_heads=4), r"layer_0/attention/query/kernel <- "
     r"encoder.albert_layer_groups.0.albert_layers.0.attention.query.weight \(64, 64\): "
     r"checkpoint no reshape vs config \(32, 4, 8\)"),
    (dict(num_hidden_groups=1), r"unexpected keys \['encoder.albert_layer_groups.1.albert_layers"),
    (dict(num_hidden_groups=3), r"missing keys \['encoder.albert_layer_groups.2.albert_layers"),
    (dict(inner_group_num=1), r"unexpected keys \['encoder.albert_layer_groups.0.albert_layers.1"),
    (dict(inner_group_num=3), r"missing keys \['encoder.albert_layer_groups.0.albert_layers.2"),
])
def test_invalid_albert_config_does_not_match_weights(groups_dir, tmp_path, changes, match):
  bad = _with_config(groups_dir, tmp_path / "bad", **changes)
  with pytest.raises(ValueError, match=match):
    pj.load_pretrained(str(bad))


@pytest.mark.parametrize("key,shape,match", [
    ("encoder.albert_layer_groups.1.albert_layers.0.ffn.weight", (90, 64),
     r"layer_4/intermediate/kernel <- {key} \(90, 64\): "
     r"checkpoint \(64, 90\) vs config \(64, 96\)"),
    ("encoder.albert_layer_groups.0.albert_layers.1.attention.key.weight", (64,),
     r"layer_1/attention/key/kernel <- {key} \(64,\): "
     r"checkpoint no reshape vs config \(64, 4, 16\)"),
])
def test_invalid_albert_tensor_shape_is_named(groups_dir, tmp_path, key, shape, match):
  """A weight file with one wrong-shaped shared tensor: named, with both shapes."""
  w = load_file(str(groups_dir / "model.safetensors"))
  w[key] = np.zeros(shape, np.float32)
  bad = _with_config(groups_dir, tmp_path / "bad")
  save_file(w, str(bad / "model.safetensors"))
  with pytest.raises(ValueError, match=match.format(key=key)):
    pj.load_pretrained(str(bad))
