"""NomicBERT: rotary positions (RoPE, positions 0..L-1) instead of position embeddings,
BERT's post-LayerNorm layers and segment embeddings, bias-free q/k/v/o and a SwiGLU MLP.
Variants this project does not implement (other rope types, rope scaling, partial rotary)
are refused by field and value.
"""

from __future__ import annotations

from typing import Any

from papa_jax.convert.families import rules
from papa_jax.convert.families.family import ROTARY, Family, rope_theta
from papa_jax.errors import ModelFileError
from papa_jax.models.config import EncoderConfig

NOMIC_THETA = 1000.0


def config(cfg: dict[str, Any], name: str) -> EncoderConfig:
  original = sorted(k for k in ("n_embd", "n_layer", "n_head", "rotary_emb_fraction",
                                "rotary_emb_base", "rotary_scaling_factor") if k in cfg)
  if original:
    raise ModelFileError(f"Unsupported NomicBERT config in the original remote-code format "
                         f"(fields {original}): Hugging Face's NomicBertConfig names them "
                         "hidden_size, num_hidden_layers, num_attention_heads, rope_parameters.")
  if cfg.get("rope_scaling") is not None:
    raise ModelFileError(f"Unsupported rope_scaling={cfg['rope_scaling']!r}.")
  theta = rope_theta(cfg.get("rope_parameters"), "rope_parameters",
                     cfg.get("rope_theta", NOMIC_THETA))
  head_dim = cfg.get("head_dim") or 0
  if head_dim * cfg["num_attention_heads"] == cfg["hidden_size"]:
    head_dim = 0
  dropout = cfg.get("hidden_dropout_prob", 0.0)
  pad = cfg.get("pad_token_id")
  return EncoderConfig(
      vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
      num_layers=cfg["num_hidden_layers"], num_heads=cfg["num_attention_heads"],
      intermediate_size=cfg["intermediate_size"],
      max_position_embeddings=cfg.get("max_position_embeddings", 2048),
      type_vocab_size=cfg.get("type_vocab_size", 2), head_dim=head_dim,
      hidden_act=cfg.get("hidden_act", "silu"), layer_norm_eps=cfg.get("layer_norm_eps", 1e-12),
      hidden_dropout=dropout, attention_dropout=cfg.get("attention_probs_dropout_prob", 0.0),
      pad_token_id=0 if pad is None else pad, position_biased_input=False, mlp="gated",
      attention_bias=False, mlp_bias=False, rotary_theta=theta, probe_dropout=dropout,
      family="nomic_bert", name=name)


def _layer(c: EncoderConfig, i: int) -> list[rules.Rule]:
  """`encoder.layers.i.*` by the original names (which HF writes back on save): fc12 is the
  activated half of the MLP (HF's gate_proj), fc11 the linear one (up_proj)."""
  p, k = (f"layer_{i}",), f"encoder.layers.{i}."
  out = rules.fused_attention(c, p + ("attention",), k + "attn.Wqkv", k + "attn.out_proj")
  out += rules.linear(p + ("intermediate",), k + "mlp.fc12", bias=False)
  out += rules.linear(p + ("up",), k + "mlp.fc11", bias=False)
  out += rules.linear(p + ("output",), k + "mlp.fc2", bias=False)
  return out + rules.ln(p + ("attention_norm",), k + "norm1") + rules.ln(p + ("output_norm",),
                                                                        k + "norm2")


def nomic_bert_rules(c: EncoderConfig, layer_groups=None) -> list[rules.Rule]:
  del layer_groups
  e = ("embeddings",)
  return (rules.embed(e + ("word_embeddings",), "embeddings.word_embeddings")
          + rules.embed(e + ("token_type_embeddings",), "embeddings.token_type_embeddings")
          + rules.ln(e + ("LayerNorm",), "emb_ln")
          + [r for i in range(c.num_layers) for r in _layer(c, i)])


NOMIC_BERT = Family(name="nomic_bert", model_types=("nomic_bert",), config=config,
                    rules=nomic_bert_rules, base_prefix="nomic_bert",
                    oracle_class="NomicBertModel", code_path=ROTARY)
