"""Hugging Face configs of the rotary families (ModernBERT, NomicBERT) -> `EncoderConfig`.

Both rotate queries and keys (RoPE, positions 0..L-1) instead of adding position
embeddings. ModernBERT: pre-LayerNorm layers (layer 0's attention norm is the
identity), a fused Wqkv, a GeGLU MLP, a final LayerNorm, switchable biases, and
local layers attending within |i - j| <= local_attention // 2 with their own
rotary base. NomicBERT: BERT's post-LayerNorm layers and segment embeddings,
bias-free q/k/v/o and a SwiGLU MLP. Variants this project does not implement
(other rope types, rope scaling, partial rotary, irregular layer patterns) are
refused by field and value.
"""

from __future__ import annotations

from typing import Any

from papa_jax.errors import ModelFileError
from papa_jax.models.config import EncoderConfig

FULL, SLIDING = "full_attention", "sliding_attention"
MODERNBERT_THETA = {FULL: 160_000.0, SLIDING: 10_000.0}  # HF ModernBertConfig's defaults.
NOMIC_THETA = 1000.0


def rope_theta(params: Any, field: str, default: float) -> float:
  """The base of a default rope entry; anything else is refused by name."""
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


def _global_every(types: list[str], num_layers: int) -> int:
  """n with layer l global iff l % n == 0, from HF's `layer_types`; refused otherwise."""
  if len(types) != num_layers or set(types) - {FULL, SLIDING}:
    raise ModelFileError(f"Unsupported layer_types={types!r}: one of {FULL!r}, {SLIDING!r} per "
                     f"layer ({num_layers}) is needed.")
  if SLIDING not in types:
    return 1
  full = [i for i, t in enumerate(types) if t == FULL]
  n = full[1] if len(full) > 1 else num_layers
  if [i % n == 0 for i in range(num_layers)] != [t == FULL for t in types]:
    raise ModelFileError(f"Unsupported layer_types={types!r}: only every n-th layer global "
                     "(from layer 0) is implemented.")
  return n


def _modernbert(cfg: dict[str, Any], name: str) -> EncoderConfig:
  layers = cfg["num_hidden_layers"]
  types = cfg.get("layer_types")
  if types is None:
    n = cfg.get("global_attn_every_n_layers", 3)
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
      raise ModelFileError(
          f"config.json: global_attn_every_n_layers={n!r} must be an integer >= 1 (1: every "
          "layer global; ModernBERT checkpoints use 3), or give layer_types, one of "
          f"{FULL!r}, {SLIDING!r} per layer.")
    types = [SLIDING if i % n else FULL for i in range(layers)]
  every = _global_every(list(types), layers)
  rope = dict(cfg.get("rope_parameters") or {})
  if "rope_scaling" in cfg and cfg["rope_scaling"] is not None:
    raise ModelFileError(f"Unsupported rope_scaling={cfg['rope_scaling']!r}.")
  theta = {kind: rope_theta(rope.get(kind), f"rope_parameters[{kind!r}]",
                            cfg.get(old, MODERNBERT_THETA[kind]))
           for kind, old in ((FULL, "global_rope_theta"), (SLIDING, "local_rope_theta"))}
  head_dim = cfg.get("head_dim")
  if head_dim not in (None, cfg["hidden_size"] // cfg["num_attention_heads"]):
    raise ModelFileError(f"Unsupported ModernBERT head_dim={head_dim!r}: HF uses "
                     "hidden_size // num_attention_heads.")
  local = every > 1 or SLIDING in types
  pad = cfg.get("pad_token_id")
  return EncoderConfig(
      vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"], num_layers=layers,
      num_heads=cfg["num_attention_heads"], intermediate_size=cfg["intermediate_size"],
      max_position_embeddings=cfg.get("max_position_embeddings", 8192), type_vocab_size=0,
      hidden_act=cfg.get("hidden_activation", "gelu"), layer_norm_eps=cfg.get("norm_eps", 1e-5),
      hidden_dropout=cfg.get("mlp_dropout", 0.0),
      attention_dropout=cfg.get("attention_dropout", 0.0),
      pad_token_id=0 if pad is None else pad, position_biased_input=False,
      norm_placement="pre", first_attention_norm=False, final_norm=True, mlp="gated",
      attention_bias=bool(cfg.get("attention_bias", False)),
      mlp_bias=bool(cfg.get("mlp_bias", False)), norm_bias=bool(cfg.get("norm_bias", False)),
      rotary_theta=theta[FULL], rotary_theta_local=theta[SLIDING] if local else 0.0,
      local_window=cfg.get("local_attention", 128) // 2 if local else 0,
      global_every=every if local else 1, probe_dropout=cfg.get("classifier_dropout") or 0.0,
      add_prefix_space=True, family="modernbert", name=name)


def _nomic_bert(cfg: dict[str, Any], name: str) -> EncoderConfig:
  original = sorted(k for k in ("n_embd", "n_layer", "n_head", "rotary_emb_fraction",
                                "rotary_emb_base", "rotary_scaling_factor") if k in cfg)
  if original:
    raise ModelFileError(f"Unsupported NomicBERT config in the original remote-code format (fields "
                     f"{original}): Hugging Face's NomicBertConfig names them hidden_size, "
                     "num_hidden_layers, num_attention_heads, rope_parameters.")
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


def rotary_config(family: str, cfg: dict[str, Any], name: str) -> EncoderConfig:
  """The `EncoderConfig` of a ModernBERT or NomicBERT config dict."""
  return _modernbert(cfg, name) if family == "modernbert" else _nomic_bert(cfg, name)
