"""ALBERT: BERT blocks with factorised embeddings and parameters shared across layers.

The embeddings (embedding_size wide) always pass through
`encoder.embedding_hidden_mapping_in` (a dense layer with bias) after their LayerNorm
and dropout, even when embedding_size equals hidden_size. Layers become a flat list
of layers * inner_group_num blocks (`albert_layer_groups`), whose shared parameters
the converter copies into each block.
"""

from __future__ import annotations

from typing import Any

from papa_jax.convert.families import rules
from papa_jax.convert.families.family import ABSOLUTE, Family, unsupported
from papa_jax.errors import ModelFileError
from papa_jax.models.config import EncoderConfig

# AlbertConfig's defaults, for keys a config.json leaves out.
ALBERT_DEFAULTS = dict(embedding_size=128, num_hidden_groups=1, inner_group_num=1,
                       hidden_act="gelu_new", hidden_dropout_prob=0.0,
                       attention_probs_dropout_prob=0.0)


def albert_layer_groups(cfg: dict[str, Any]) -> rules.LayerGroups:
  """(group, sub-layer) of each flat layer, in the order HF's AlbertTransformer runs them.

  Layer i of num_hidden_layers uses group int(i / (num_hidden_layers / num_hidden_groups))
  (HF's float formula, kept as is) and runs that group's inner_group_num sub-layers in
  turn, each one post-LayerNorm block: the flat list has layers * inner_group_num blocks.
  """
  c = {**ALBERT_DEFAULTS, **cfg}
  layers, groups, inner = c["num_hidden_layers"], c["num_hidden_groups"], c["inner_group_num"]
  for key, value, top in (("num_hidden_groups", groups, layers), ("inner_group_num", inner, None)):
    if not isinstance(value, int) or value < 1 or (top is not None and value > top):
      raise ModelFileError(
          f"Unsupported ALBERT {key}={value!r}: an integer >= 1"
          + (f" and <= num_hidden_layers={layers} (a group no layer uses)" if top else "")
          + ".")
  return tuple((int(i / (layers / groups)), j) for i in range(layers) for j in range(inner))


def config(cfg: dict[str, Any], name: str) -> EncoderConfig:
  c = {**ALBERT_DEFAULTS, **cfg}
  unsupported(c, "position_embedding_type", "absolute", "ALBERT position embedding type")
  act = c["hidden_act"]
  if not isinstance(act, str):
    raise ModelFileError(f"Unsupported non-string activation {act!r}.")
  blocks = len(albert_layer_groups(c))
  return EncoderConfig(
      vocab_size=c["vocab_size"], hidden_size=c["hidden_size"], num_layers=blocks,
      num_heads=c["num_attention_heads"], intermediate_size=c["intermediate_size"],
      max_position_embeddings=c["max_position_embeddings"],
      type_vocab_size=c.get("type_vocab_size", 2), embedding_size=c["embedding_size"],
      hidden_act=act, layer_norm_eps=c.get("layer_norm_eps", 1e-12),
      hidden_dropout=c["hidden_dropout_prob"],
      attention_dropout=c["attention_probs_dropout_prob"],
      pad_token_id=c.get("pad_token_id", 0) or 0, embedding_projection="after_dropout",
      probe_dropout=c["hidden_dropout_prob"], family="albert", name=name)


def _layer(p: tuple[str, ...], k: str, h: int, d: int) -> list[rules.Rule]:
  """One ALBERT block from the shared `albert_layer_groups.G.albert_layers.J.` tensors."""
  a = p + ("attention",)
  out = [r for n in ("query", "key", "value")
         for r in rules.heads(a + (n,), k + "attention." + n, h, d)]
  return (out + rules.out(a, k + "attention.dense", h, d)
          + rules.ln(p + ("attention_norm",), k + "attention.LayerNorm")
          + rules.linear(p + ("intermediate",), k + "ffn")
          + rules.linear(p + ("output",), k + "ffn_output")
          + rules.ln(p + ("output_norm",), k + "full_layer_layer_norm"))


def albert_rules(c: EncoderConfig,
                 layer_groups: rules.LayerGroups | None = None) -> list[rules.Rule]:
  """`layer_groups` (`albert_layer_groups`): each flat layer's (group, sub-layer). Shared
  tensors are copied into every layer that uses them: exact for inference and for PAPA,
  which treats each layer's heads separately; training then updates each copy on its own."""
  out = rules.embeddings(c, "encoder.embedding_hidden_mapping_in", proj_bias=True)
  if layer_groups is None or len(layer_groups) != c.num_layers:
    raise ModelFileError(f"ALBERT needs each of its {c.num_layers} layers' (group, sub-layer), "
                         f"got {layer_groups!r}.")
  for i, (g, j) in enumerate(layer_groups):
    k = f"encoder.albert_layer_groups.{g}.albert_layers.{j}."
    out += _layer((f"layer_{i}",), k, c.num_heads, c.dim_per_head)
  return out


ALBERT = Family(name="albert", model_types=("albert",), config=config, rules=albert_rules,
                base_prefix="albert", oracle_class="AlbertModel", code_path=ABSOLUTE,
                shared_layers=albert_layer_groups)
