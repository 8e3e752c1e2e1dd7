"""ModernBERT: rotary positions (RoPE, positions 0..L-1) instead of position embeddings,
pre-LayerNorm layers (layer 0's attention norm is the identity), a fused Wqkv, a GeGLU MLP,
a final LayerNorm, switchable biases, and local layers attending within
|i - j| <= local_attention // 2 with their own rotary base. Variants this project does not
implement (other rope types, rope scaling, irregular layer patterns) are refused by field
and value.
"""

from __future__ import annotations

from typing import Any

from papa_jax.convert.families import rules
from papa_jax.convert.families.family import ROTARY_LOCAL_PRE_LN, Family, rope_theta
from papa_jax.errors import ModelFileError
from papa_jax.models.config import EncoderConfig

FULL, SLIDING = "full_attention", "sliding_attention"
MODERNBERT_THETA = {FULL: 160_000.0, SLIDING: 10_000.0}  # HF ModernBertConfig's defaults.


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


def config(cfg: dict[str, Any], name: str) -> EncoderConfig:
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


def _layer(c: EncoderConfig, i: int) -> list[rules.Rule]:
  """`layers.i.*`: `Wi` holds the activated half of the MLP's input, then the linear one."""
  p, im, mb = (f"layer_{i}",), c.intermediate_size, c.mlp_bias
  k = f"layers.{i}."
  out = rules.fused_attention(c, p + ("attention",), k + "attn.Wqkv", k + "attn.Wo")
  for j, name in enumerate(("intermediate", "up")):
    out.append((p + (name, "kernel"), k + "mlp.Wi.weight",
                lambda w, j=j: rules.t(w[j * im:(j + 1) * im])))
    if mb:
      out.append((p + (name, "bias"), k + "mlp.Wi.bias", lambda x, j=j: x[j * im:(j + 1) * im]))
  out += rules.linear(p + ("output",), k + "mlp.Wo", bias=mb)
  if i or c.first_attention_norm:
    out += rules.ln(p + ("attention_norm",), k + "attn_norm", c.norm_bias)
  return out + rules.ln(p + ("mlp_norm",), k + "mlp_norm", c.norm_bias)


def modernbert_rules(c: EncoderConfig, layer_groups=None) -> list[rules.Rule]:
  del layer_groups
  e = ("embeddings",)
  return (rules.embed(e + ("word_embeddings",), "embeddings.tok_embeddings")
          + rules.ln(e + ("LayerNorm",), "embeddings.norm", c.norm_bias)
          + [r for i in range(c.num_layers) for r in _layer(c, i)]
          + rules.ln(("final_norm",), "final_norm", c.norm_bias))


MODERNBERT = Family(name="modernbert", model_types=("modernbert",), config=config,
                    rules=modernbert_rules, base_prefix="model", oracle_class="ModernBertModel",
                    code_path=ROTARY_LOCAL_PRE_LN)
