"""Hugging Face `config.json` -> `EncoderConfig`.

Attributes that change the architecture in ways this project does not
implement are an error; metadata is ignored.
"""

from __future__ import annotations

import os
from typing import Any

from papa_jax.convert import hf_rotary
from papa_jax.convert.checkpoint_io import read_json_object
from papa_jax.errors import ModelFileError, ModelNotFound
from papa_jax.models.config import EncoderConfig

# model_type -> family. XLM-R and CamemBERT share RoBERTa's architecture.
MODEL_TYPES = {
    "bert": "bert",
    "roberta": "roberta",
    "xlm-roberta": "roberta",
    "camembert": "roberta",
    "electra": "electra",
    "distilbert": "distilbert",
    "deberta": "deberta",
    "deberta-v2": "deberta-v2",
    "mpnet": "mpnet",
    "albert": "albert",
    "modernbert": "modernbert",
    "nomic_bert": "nomic_bert",
}
# What Hugging Face's MPNetModel hard-codes, whatever its config says.
MPNET_PADDING_IDX = 1
MPNET_BUCKETS = 32
MPNET_MAX_DISTANCE = 128
# AlbertConfig's defaults, for keys a config.json leaves out.
ALBERT_DEFAULTS = dict(embedding_size=128, num_hidden_groups=1, inner_group_num=1,
                       hidden_act="gelu_new", hidden_dropout_prob=0.0,
                       attention_probs_dropout_prob=0.0)


def read_config_json(model_dir: str) -> dict[str, Any]:
  path = os.path.join(model_dir, "config.json")
  if not os.path.isdir(model_dir):
    raise ModelNotFound(f"Model directory {model_dir!r} does not exist.")
  if not os.path.isfile(path):
    raise ModelNotFound(
        f"{model_dir!r} has no config.json; a Hugging Face model directory "
        "needs config.json plus model.safetensors or pytorch_model.bin."
    )
  return read_json_object(path)


def _unsupported(cfg: dict[str, Any], key: str, ok: Any, what: str) -> None:
  value = cfg.get(key, ok)
  if value != ok and not (isinstance(ok, tuple) and value in ok):
    raise ModelFileError(f"Unsupported {what}: {key}={value!r}.")


def encoder_config_from_hf(cfg: dict[str, Any], name: str = "") -> EncoderConfig:
  """Maps a Hugging Face config dict to an `EncoderConfig`, resolving family quirks;
  ValueError naming the field when one is missing or out of range."""
  try:
    return _encoder_config(cfg, name)
  except KeyError as e:
    raise ModelFileError(f"config.json{_of(name)} lacks the field {e.args[0]!r}, which a "
                     f"{cfg.get('model_type')} config needs.") from None
  except ValueError as e:
    raise ModelFileError(f"config.json{_of(name)}: {e}") from None


def _of(name: str) -> str:
  return f" of {name}" if name else ""


def _encoder_config(cfg: dict[str, Any], name: str) -> EncoderConfig:
  model_type = cfg.get("model_type")
  if model_type not in MODEL_TYPES:
    raise ModelFileError(
        f"Unsupported model_type {model_type!r}; supported: {sorted(MODEL_TYPES)}."
    )
  family = MODEL_TYPES[model_type]
  act = cfg.get("hidden_act", cfg.get("activation", "gelu"))
  if not isinstance(act, str):
    raise ModelFileError(f"Unsupported non-string activation {act!r}.")
  for key in ("is_decoder", "add_cross_attention"):
    _unsupported(cfg, key, False, "decoder configuration")
  if family == "albert":
    return _albert_config(cfg, name)
  if family in ("modernbert", "nomic_bert"):
    return hf_rotary.rotary_config(family, cfg, name)

  if family == "distilbert":
    return EncoderConfig(
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["dim"],
        num_layers=cfg["n_layers"],
        num_heads=cfg["n_heads"],
        intermediate_size=cfg["hidden_dim"],
        max_position_embeddings=cfg["max_position_embeddings"],
        type_vocab_size=0,  # No segment embeddings.
        hidden_act=act,
        layer_norm_eps=1e-12,  # Hard-coded in HF DistilBERT.
        hidden_dropout=cfg.get("dropout", 0.1),
        attention_dropout=cfg.get("attention_dropout", 0.1),
        pad_token_id=cfg.get("pad_token_id", 0) or 0,
        probe_dropout=cfg.get("dropout", 0.1),
        family=family,
        name=name,
    )

  hidden_dropout = cfg.get("hidden_dropout_prob", 0.1)
  common = dict(
      vocab_size=cfg["vocab_size"],
      hidden_size=cfg["hidden_size"],
      num_layers=cfg["num_hidden_layers"],
      num_heads=cfg["num_attention_heads"],
      intermediate_size=cfg["intermediate_size"],
      max_position_embeddings=cfg["max_position_embeddings"],
      type_vocab_size=cfg.get("type_vocab_size", 2),
      hidden_act=act,
      layer_norm_eps=cfg.get("layer_norm_eps", 1e-12),
      hidden_dropout=hidden_dropout,
      attention_dropout=cfg.get("attention_probs_dropout_prob", 0.1),
      pad_token_id=cfg.get("pad_token_id", 0) or 0,
      probe_dropout=hidden_dropout,
      family=family,
      name=name,
  )
  if family == "mpnet":
    return _mpnet_config(cfg, common)
  if family in ("bert", "roberta", "electra"):
    _unsupported(cfg, "position_embedding_type", "absolute", "position embedding type")
    if family == "roberta":  # PAPA's recipe: no probe dropout for RoBERTa.
      common.update(position_ids="from_padding", probe_dropout=0.0, add_prefix_space=True)
    if family == "electra":
      common["embedding_size"] = cfg.get("embedding_size", cfg["hidden_size"])
      common["embedding_projection"] = (
          "after_dropout" if common["embedding_size"] != cfg["hidden_size"] else "none")
    return EncoderConfig(**common)

  # DeBERTa v1 / v2 (v3 checkpoints are model_type deberta-v2).
  v1 = family == "deberta"
  _unsupported(cfg, "talking_head", False, "DeBERTa option")
  _unsupported(cfg, "conv_kernel_size", 0, "DeBERTa-v2 option")
  pos_att_type = cfg.get("pos_att_type") or []
  if isinstance(pos_att_type, str):
    pos_att_type = [p.strip() for p in pos_att_type.lower().split("|") if p.strip()]
  norm = [x.strip() for x in str(cfg.get("norm_rel_ebd", "none")).lower().split("|")]
  if set(norm) - {"none", "layer_norm"}:
    raise ModelFileError(f"Unsupported norm_rel_ebd={cfg.get('norm_rel_ebd')!r}.")
  head_dim = 0 if v1 else cfg.get("attention_head_size", 0)
  if head_dim and head_dim * cfg["num_attention_heads"] == cfg["hidden_size"]:
    head_dim = 0
  relative = bool(cfg.get("relative_attention", False))
  max_rel = cfg.get("max_relative_positions", -1)
  if max_rel is None or max_rel < 1:  # HF falls back to max_position_embeddings.
    max_rel = cfg["max_position_embeddings"]
  embedding_size = cfg.get("embedding_size", cfg["hidden_size"]) or cfg["hidden_size"]
  buckets = -1 if v1 else cfg.get("position_buckets", -1)
  return EncoderConfig(
      **{**common, "type_vocab_size": cfg.get("type_vocab_size", 0)},
      embedding_size=embedding_size,
      head_dim=head_dim or 0,
      position_biased_input=cfg.get("position_biased_input", True),
      embedding_projection="before_norm" if embedding_size != cfg["hidden_size"] else "none",
      mask_embeddings=True,
      key_bias=not v1,
      attention="disentangled",
      relative_attention=relative,
      pos_att_type=tuple(pos_att_type),
      max_relative_positions=max_rel if relative else -1,
      position_buckets=buckets if buckets and buckets > 0 else -1,
      relative_span="clip_to_length" if v1 else "full",
      share_att_key=False if v1 else cfg.get("share_att_key", False),
      norm_rel_ebd="layer_norm" in norm and not v1,
      scale_query_first=v1,
      add_prefix_space=v1,  # v1 uses GPT-2's byte-level BPE.
  )


def _mpnet_config(cfg: dict[str, Any], common: dict[str, Any]) -> EncoderConfig:
  """MPNet: BERT layers without segments, RoBERTa positions, a shared relative bias.

  HF's MPNetModel counts positions from padding_idx 1 and buckets offsets into
  32 buckets whatever the config says; a config saying otherwise describes a
  model that HF itself computes inconsistently, so it is refused.
  """
  pad = cfg.get("pad_token_id")
  pad = MPNET_PADDING_IDX if pad is None else pad
  if pad != MPNET_PADDING_IDX:
    raise ModelFileError(
        f"Unsupported MPNet pad_token_id={pad!r}: Hugging Face's MPNetModel counts "
        f"positions from padding_idx {MPNET_PADDING_IDX} whatever the config says, so "
        "pads of another id would get positions.")
  buckets = cfg.get("relative_attention_num_buckets", MPNET_BUCKETS)
  if buckets != MPNET_BUCKETS:
    raise ModelFileError(
        f"Unsupported MPNet relative_attention_num_buckets={buckets!r}: Hugging Face's "
        f"MPNetModel always buckets offsets into {MPNET_BUCKETS} (its table would not "
        "match its buckets).")
  return EncoderConfig(**{**common, "type_vocab_size": 0, "pad_token_id": pad},
                       position_ids="from_padding", relative_bias_buckets=buckets,
                       relative_bias_max_distance=MPNET_MAX_DISTANCE)


def albert_layer_groups(cfg: dict[str, Any]) -> tuple[tuple[int, int], ...]:
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


def shared_layers(cfg: dict[str, Any]) -> tuple[tuple[int, int], ...] | None:
  """Each flat layer's (group, sub-layer) when layers share parameters (ALBERT), else None."""
  return albert_layer_groups(cfg) if MODEL_TYPES.get(cfg.get("model_type")) == "albert" else None


def _albert_config(cfg: dict[str, Any], name: str) -> EncoderConfig:
  """ALBERT: BERT blocks with factorised embeddings and parameters shared across layers.

  The embeddings (embedding_size wide) always pass through
  `encoder.embedding_hidden_mapping_in` (a dense layer with bias) after their LayerNorm
  and dropout, even when embedding_size equals hidden_size. Layers become a flat list
  of layers * inner_group_num blocks (`albert_layer_groups`), whose shared parameters
  the converter copies into each block.
  """
  c = {**ALBERT_DEFAULTS, **cfg}
  _unsupported(c, "position_embedding_type", "absolute", "ALBERT position embedding type")
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
