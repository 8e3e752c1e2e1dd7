"""The record of one model family (`Family`), its code paths, and the config helpers the
BERT-layout families share."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

from papa_jax.convert.families.rules import LayerGroups, Rule
from papa_jax.errors import ModelFileError
from papa_jax.models.config import EncoderConfig


class CodePath(NamedTuple):
  """What the encoder's attention and layer code (`models/encoder.py`) branch on: the
  `EncoderConfig` a family's configs resolve to, reduced to its code path."""

  attention: str  # EncoderConfig.attention: "dot" or "disentangled".
  relative_bias: bool  # relative_bias_buckets > 0 (MPNet's shared bias).
  local_window: bool  # local_window > 0 (windowed layers).
  rotary: bool  # rotary_theta > 0 (rotated queries and keys).
  norm_placement: str  # "post" or "pre" LayerNorm: the layer layout.

  @classmethod
  def of(cls, c: EncoderConfig) -> CodePath:
    return cls(c.attention, c.relative_bias_buckets > 0, c.local_window > 0, c.rotary_theta > 0,
               c.norm_placement)


class MLMHeadNames(NamedTuple):
  """Where a `*ForMaskedLM` checkpoint keeps its head (`causal/metrics.py` reads it): the
  dense layer, the LayerNorm, the decoder (absent when tied to the word embeddings) and the
  output bias; tensor-name prefixes."""

  dense: str
  norm: str
  decoder: str
  bias: str


LM_HEAD = MLMHeadNames("lm_head.dense", "lm_head.layer_norm", "lm_head.decoder", "lm_head.bias")
ABSOLUTE = CodePath("dot", False, False, False, "post")  # BERT: absolute positions.
DISENTANGLED = CodePath("disentangled", False, False, False, "post")  # DeBERTa.
RELATIVE_BIAS = CodePath("dot", True, False, False, "post")  # MPNet.
ROTARY = CodePath("dot", False, False, True, "post")  # NomicBERT.
ROTARY_LOCAL_PRE_LN = CodePath("dot", False, True, True, "pre")  # ModernBERT.


@dataclasses.dataclass(frozen=True)
class Family:
  """One Hugging Face model family: how its config.json and its tensors are read, and what the
  tests compare it with.

  Attributes:
    name: `EncoderConfig.family` of its models (what the parameter rules dispatch on; the
      ONNX reader writes "bert"); also the name of its representative random architecture in
      `tests/hf_oracle.py`.
    model_types: the config.json `model_type` strings it reads (each in one family only).
    config: (config.json dict, model name) -> `EncoderConfig`; a missing field may raise
      KeyError and a bad value ValueError (`hf_config` words both for the user).
    rules: (config, layer groups or None) -> the rules `(flax_path, hf_key, transform)` that
      name every tensor of the base model.
    base_prefix: the prefix of the base model's tensors in a task model's checkpoint
      ("bert" for `bert.embeddings...`; "" for none).
    oracle_class: the Hugging Face PyTorch class the tests compare it with (a name: no
      `transformers` import at run time).
    code_path: the attention code path its models run (`CodePath`); the tests' unit tier runs
      the first family of each path.
    shared_layers: config.json dict -> each flat layer's (group, sub-layer) when layers share
      tensors (ALBERT); None for a family whose layers are its own.
    mlm_head: where its `*ForMaskedLM` checkpoints keep the MLM head (`MLMHeadNames`); None
      where it is not read.
  """

  name: str
  model_types: tuple[str, ...]
  config: Callable[[dict[str, Any], str], EncoderConfig]
  rules: Callable[[EncoderConfig, LayerGroups | None], list[Rule]]
  base_prefix: str
  oracle_class: str
  code_path: CodePath
  shared_layers: Callable[[dict[str, Any]], LayerGroups] | None = None
  mlm_head: MLMHeadNames | None = None


def unsupported(cfg: dict[str, Any], key: str, ok: Any, what: str) -> None:
  """Refuses `cfg[key]` unless it is `ok` (or one of `ok`, a tuple); absent is `ok`."""
  value = cfg.get(key, ok)
  if value != ok and not (isinstance(ok, tuple) and value in ok):
    raise ModelFileError(f"Unsupported {what}: {key}={value!r}.")


def activation(cfg: dict[str, Any]) -> Any:
  return cfg.get("hidden_act", cfg.get("activation", "gelu"))


def bert_fields(cfg: dict[str, Any], name: str, family: str) -> dict[str, Any]:
  """The `EncoderConfig` fields of a config.json in BertConfig's names."""
  hidden_dropout = cfg.get("hidden_dropout_prob", 0.1)
  return dict(
      vocab_size=cfg["vocab_size"],
      hidden_size=cfg["hidden_size"],
      num_layers=cfg["num_hidden_layers"],
      num_heads=cfg["num_attention_heads"],
      intermediate_size=cfg["intermediate_size"],
      max_position_embeddings=cfg["max_position_embeddings"],
      type_vocab_size=cfg.get("type_vocab_size", 2),
      hidden_act=activation(cfg),
      layer_norm_eps=cfg.get("layer_norm_eps", 1e-12),
      hidden_dropout=hidden_dropout,
      attention_dropout=cfg.get("attention_probs_dropout_prob", 0.1),
      pad_token_id=cfg.get("pad_token_id", 0) or 0,
      probe_dropout=hidden_dropout,
      family=family,
      name=name,
  )


def absolute_fields(cfg: dict[str, Any], name: str, family: str) -> dict[str, Any]:
  """`bert_fields` of a family with absolute position embeddings only."""
  fields = bert_fields(cfg, name, family)
  unsupported(cfg, "position_embedding_type", "absolute", "position embedding type")
  return fields


def rope_theta(params: Any, field: str, default: float) -> float:
  """The base of a default rope entry (rotary families); anything else is refused by name."""
  params = dict(params or {})
  kind = params.pop("rope_type", params.pop("type", "default"))
  if kind != "default":
    raise ModelFileError(f"Unsupported rope type: {field}.rope_type={kind!r} (only 'default').")
  theta = params.pop("rope_theta", default)
  extra = {k: v for k, v in params.items() if v is not None and
           not (k == "partial_rotary_factor" and v == 1.0)}
  if extra:
    raise ModelFileError(f"Unsupported rope options: {field} has {extra!r} (only rope_theta).")
  return float(theta)
