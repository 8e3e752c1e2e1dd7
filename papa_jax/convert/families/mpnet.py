"""MPNet: BERT layers without segments, RoBERTa positions, a shared relative bias."""

from __future__ import annotations

from typing import Any

from papa_jax.convert.families import rules
from papa_jax.convert.families.family import LM_HEAD, RELATIVE_BIAS, Family, bert_fields
from papa_jax.errors import ModelFileError
from papa_jax.models.config import EncoderConfig

# What Hugging Face's MPNetModel hard-codes, whatever its config says.
MPNET_PADDING_IDX = 1
MPNET_BUCKETS = 32
MPNET_MAX_DISTANCE = 128


def config(cfg: dict[str, Any], name: str) -> EncoderConfig:
  """HF's MPNetModel counts positions from padding_idx 1 and buckets offsets into
  32 buckets whatever the config says; a config saying otherwise describes a
  model that HF itself computes inconsistently, so it is refused.
  """
  common = bert_fields(cfg, name, "mpnet")
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


def _attention(c: EncoderConfig, a: tuple[str, ...], k: str):
  """`attention.attn.{q,k,v,o}` and `attention.LayerNorm`."""
  s = k + "attention.attn."
  out = [r for name in ("query", "key", "value")
         for r in rules.heads(a + (name,), s + name[0], c.num_heads, c.dim_per_head)]
  return out, s + "o", k + "attention.LayerNorm"


def mpnet_rules(c: EncoderConfig, layer_groups=None) -> list[rules.Rule]:
  del layer_groups
  return rules.embeddings(c) + rules.bert_layers(c, _attention)


MPNET = Family(name="mpnet", model_types=("mpnet",), config=config, rules=mpnet_rules,
               base_prefix="mpnet", oracle_class="MPNetModel", code_path=RELATIVE_BIAS,
               mlm_head=LM_HEAD)
