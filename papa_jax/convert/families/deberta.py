"""DeBERTa v1 and v2 (v3 checkpoints are model_type deberta-v2): disentangled attention over
relative positions, two families that share their config keys and most of their tensors."""

from __future__ import annotations

from typing import Any

import numpy as np

from papa_jax.convert.families import rules
from papa_jax.convert.families.family import DISENTANGLED, Family, bert_fields, unsupported
from papa_jax.errors import ModelFileError
from papa_jax.models.config import EncoderConfig


def _config(cfg: dict[str, Any], name: str, v1: bool) -> EncoderConfig:
  common = bert_fields(cfg, name, "deberta" if v1 else "deberta-v2")
  unsupported(cfg, "talking_head", False, "DeBERTa option")
  unsupported(cfg, "conv_kernel_size", 0, "DeBERTa-v2 option")
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


def _in_proj(path, key, h, d, part) -> rules.Rule:
  """DeBERTa v1 fused in_proj [3*h*d, D], interleaved per head as q,k,v."""
  def f(w):
    w4 = w.reshape(h, 3, d, w.shape[-1])[:, part]  # [h, d, D]
    return np.ascontiguousarray(np.transpose(w4, (2, 0, 1)))
  return (path + ("kernel",), key + ".weight", f)


def _v1_attention(c: EncoderConfig, a: tuple[str, ...], k: str):
  h, d, s = c.num_heads, c.dim_per_head, k + "attention.self."
  out = [_in_proj(a + (n,), s + "in_proj", h, d, j)
         for j, n in enumerate(("query", "key", "value"))]
  out.append((a + ("query", "bias"), s + "q_bias", lambda b: b.reshape(h, d)))
  out.append((a + ("value", "bias"), s + "v_bias", lambda b: b.reshape(h, d)))
  if c.relative_attention and "c2p" in c.pos_att_type:
    out += rules.heads(a + ("pos_key",), s + "pos_proj", h, d, bias=False)
  if c.relative_attention and "p2c" in c.pos_att_type:
    out += rules.heads(a + ("pos_query",), s + "pos_q_proj", h, d)
  return out, k + "attention.output.dense", k + "attention.output.LayerNorm"


def _v2_attention(c: EncoderConfig, a: tuple[str, ...], k: str):
  h, d, s = c.num_heads, c.dim_per_head, k + "attention.self."
  out = rules.heads(a + ("query",), s + "query_proj", h, d)
  out += rules.heads(a + ("key",), s + "key_proj", h, d)
  out += rules.heads(a + ("value",), s + "value_proj", h, d)
  if c.relative_attention and not c.share_att_key:
    if "c2p" in c.pos_att_type:
      out += rules.heads(a + ("pos_key",), s + "pos_key_proj", h, d)
    if "p2c" in c.pos_att_type:
      out += rules.heads(a + ("pos_query",), s + "pos_query_proj", h, d)
  return out, k + "attention.output.dense", k + "attention.output.LayerNorm"


def v1_config(cfg: dict[str, Any], name: str) -> EncoderConfig:
  return _config(cfg, name, v1=True)


def v2_config(cfg: dict[str, Any], name: str) -> EncoderConfig:
  return _config(cfg, name, v1=False)


def v1_rules(c: EncoderConfig, layer_groups=None) -> list[rules.Rule]:
  del layer_groups
  return rules.embeddings(c) + rules.bert_layers(c, _v1_attention)


def v2_rules(c: EncoderConfig, layer_groups=None) -> list[rules.Rule]:
  del layer_groups
  return rules.embeddings(c) + rules.bert_layers(c, _v2_attention)


DEBERTA = Family(name="deberta", model_types=("deberta",), config=v1_config, rules=v1_rules,
                 base_prefix="deberta", oracle_class="DebertaModel", code_path=DISENTANGLED)
DEBERTA_V2 = Family(name="deberta-v2", model_types=("deberta-v2",), config=v2_config,
                    rules=v2_rules, base_prefix="deberta", oracle_class="DebertaV2Model",
                    code_path=DISENTANGLED)
