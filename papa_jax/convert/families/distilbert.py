"""DistilBERT: BERT's layers under other names and config keys, no segment embeddings."""

from __future__ import annotations

from typing import Any

from papa_jax.convert.families import rules
from papa_jax.convert.families.family import ABSOLUTE, Family, MLMHeadNames, activation
from papa_jax.models.config import EncoderConfig


def config(cfg: dict[str, Any], name: str) -> EncoderConfig:
  return EncoderConfig(
      vocab_size=cfg["vocab_size"],
      hidden_size=cfg["dim"],
      num_layers=cfg["n_layers"],
      num_heads=cfg["n_heads"],
      intermediate_size=cfg["hidden_dim"],
      max_position_embeddings=cfg["max_position_embeddings"],
      type_vocab_size=0,  # No segment embeddings.
      hidden_act=activation(cfg),
      layer_norm_eps=1e-12,  # Hard-coded in HF DistilBERT.
      hidden_dropout=cfg.get("dropout", 0.1),
      attention_dropout=cfg.get("attention_dropout", 0.1),
      pad_token_id=cfg.get("pad_token_id", 0) or 0,
      probe_dropout=cfg.get("dropout", 0.1),
      family="distilbert",
      name=name,
  )


def distilbert_rules(c: EncoderConfig, layer_groups=None) -> list[rules.Rule]:
  del layer_groups
  h, d = c.num_heads, c.dim_per_head
  out = rules.embeddings(c)
  for i in range(c.num_layers):
    p = (f"layer_{i}",)
    a = p + ("attention",)
    k = f"transformer.layer.{i}."
    out += rules.heads(a + ("query",), k + "attention.q_lin", h, d)
    out += rules.heads(a + ("key",), k + "attention.k_lin", h, d)
    out += rules.heads(a + ("value",), k + "attention.v_lin", h, d)
    out += rules.out(a, k + "attention.out_lin", h, d)
    out += rules.ln(p + ("attention_norm",), k + "sa_layer_norm")
    out += rules.linear(p + ("intermediate",), k + "ffn.lin1")
    out += rules.linear(p + ("output",), k + "ffn.lin2")
    out += rules.ln(p + ("output_norm",), k + "output_layer_norm")
  return out


DISTILBERT = Family(name="distilbert", model_types=("distilbert",), config=config,
                    rules=distilbert_rules, base_prefix="distilbert",
                    oracle_class="DistilBertModel", code_path=ABSOLUTE,
                    mlm_head=MLMHeadNames("vocab_transform", "vocab_layer_norm",
                                          "vocab_projector", "vocab_projector.bias"))
