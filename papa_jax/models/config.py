"""What an encoder does, as named architecture flags (no family names).

The converter (`papa_jax/convert/hf_config.py`) resolves each Hugging Face
family's quirks into these fields once, so model code branches on what a model
does. A new family that recombines known quirks needs a converter entry only.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish")
POSITION_IDS = ("arange", "from_padding")
EMBEDDING_PROJECTIONS = ("none", "before_norm", "after_dropout")
ATTENTION_KINDS = ("dot", "disentangled")
RELATIVE_SPANS = ("clip_to_length", "full")
NORM_PLACEMENTS = ("post", "pre")
MLPS = ("dense", "gated")
UNLIMITED = 1 << 30


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
  """Hyper-parameters and architecture flags of a post-LayerNorm encoder.

  Sizes mirror Hugging Face names where they exist. Flags:
    position_ids: "arange" (0..L-1), or "from_padding" (RoBERTa: pad id + 1 +
      the running count of real tokens, pad positions get the pad id).
    position_biased_input: absolute position embeddings are added.
    embedding_projection: "none"; "before_norm" (a bias-free dense layer to
      hidden_size before the embedding LayerNorm, DeBERTa); "after_dropout" (a
      dense layer with bias after LayerNorm and dropout, ELECTRA).
    mask_embeddings: embeddings are multiplied by the mask after LayerNorm.
    key_bias: the key (and relative-position key) projections have a bias.
    attention: "dot" (scaled dot product, pad keys masked) or "disentangled"
      (DeBERTa content/position terms, every pair with a pad token masked).
    relative_attention, pos_att_type, position_buckets, share_att_key,
      norm_rel_ebd: DeBERTa's relative attention (`models/deberta.py`).
    max_relative_positions: resolved (> 0) whenever relative_attention.
    relative_span: "clip_to_length" (span min(L, max_relative_positions),
      embedding rows centred on max_relative_positions) or "full" (span
      position_buckets or max_relative_positions, the first 2 span rows).
    scale_query_first: divide the query (and position query) by the scale
      before the products, instead of each score term after.
    relative_bias_buckets: > 0 adds a learned per-head bias of the offset
      i - j (query i, key j) to every layer's dot-product scores, before the
      padding mask: one `[buckets, heads]` table shared by all layers, rows
      picked by T5-style bidirectional buckets (`models/relative_bias.py`);
      0: none.
    relative_bias_max_distance: the log-spaced buckets span offsets up to it;
      longer ones share the last bucket of their sign.
    norm_placement: "post" (BERT: LayerNorm after each residual sum) or "pre"
      (ModernBERT: `x + attn(LN(x))`, then `h + mlp(LN(h))`).
    first_attention_norm: with "pre", layer 0 normalises its attention input
      (False: identity there, ModernBERT, whose embeddings end in a LayerNorm).
    final_norm: a LayerNorm on the last layer's output (the last hidden state).
    mlp: "dense" (`W2 act(W1 h)`) or "gated" (`W2 (act(W1 h) * (U h))`, GeGLU or
      SwiGLU as `hidden_act` says; `U` is the "up" projection).
    attention_bias, mlp_bias, norm_bias: whether the q/k/v/output projections,
      the MLP's dense layers and the LayerNorms have biases (key_bias also).
    rotary_theta: > 0 rotates queries and keys by their absolute positions
      0..L-1 (RoPE, halves rotated, `models/rotary.py`) with this base; 0: none.
    rotary_theta_local: the base on local (windowed) layers (0: rotary_theta).
    local_window: > 0 makes layers local: query i sees key j only when
      |i - j| <= local_window (HF ModernBERT's local_attention // 2); 0: none.
    global_every: with local_window, layer l is global (unwindowed) when
      l % global_every == 0, local otherwise.
    probe_dropout: the PAPA recipe's probe dropout for this checkpoint.
    add_prefix_space: its byte-level BPE tokenizer needs a prefix space for
      pre-split words.
    compute_dtype: "float32", or "bfloat16" for mixed precision (bf16
      matmuls; float32 parameters, residual stream, LayerNorms and softmax).
    family, name: provenance only (the converter's key, a path or hub id).
  """

  vocab_size: int
  hidden_size: int
  num_layers: int
  num_heads: int
  intermediate_size: int
  max_position_embeddings: int
  type_vocab_size: int = 2  # 0: no segment embeddings.
  embedding_size: int = 0  # 0 means hidden_size.
  head_dim: int = 0  # 0 means hidden_size // num_heads.
  hidden_act: str = "gelu"
  layer_norm_eps: float = 1e-12
  hidden_dropout: float = 0.1
  attention_dropout: float = 0.1
  pad_token_id: int = 0
  position_ids: str = "arange"
  position_biased_input: bool = True
  embedding_projection: str = "none"
  mask_embeddings: bool = False
  key_bias: bool = True
  attention: str = "dot"
  relative_attention: bool = False
  pos_att_type: tuple[str, ...] = ()
  max_relative_positions: int = -1
  position_buckets: int = -1
  relative_span: str = "full"
  share_att_key: bool = False
  norm_rel_ebd: bool = False
  scale_query_first: bool = False
  relative_bias_buckets: int = 0
  relative_bias_max_distance: int = 128
  norm_placement: str = "post"
  first_attention_norm: bool = True
  final_norm: bool = False
  mlp: str = "dense"
  attention_bias: bool = True
  mlp_bias: bool = True
  norm_bias: bool = True
  rotary_theta: float = 0.0
  rotary_theta_local: float = 0.0
  local_window: int = 0
  global_every: int = 1
  probe_dropout: float = 0.1
  add_prefix_space: bool = False
  compute_dtype: str = "float32"  # Matmul dtype ("bfloat16": mixed precision).
  family: str = ""
  name: str = ""

  def __post_init__(self):
    self._check_numbers()
    for field, value, allowed in (
        ("hidden_act", self.hidden_act, ACTIVATIONS),
        ("position_ids", self.position_ids, POSITION_IDS),
        ("embedding_projection", self.embedding_projection, EMBEDDING_PROJECTIONS),
        ("attention", self.attention, ATTENTION_KINDS),
        ("relative_span", self.relative_span, RELATIVE_SPANS),
        ("compute_dtype", self.compute_dtype, ("float32", "bfloat16")),
        ("norm_placement", self.norm_placement, NORM_PLACEMENTS),
        ("mlp", self.mlp, MLPS),
    ):
      if value not in allowed:
        # caller's argument
        raise ValueError(f"Unsupported {field}={value!r}; supported: {allowed}.")
    if not self.head_dim and self.hidden_size % self.num_heads:
      raise ValueError(
          f"hidden_size {self.hidden_size} is not a multiple of num_heads {self.num_heads}."
      )  # caller's argument
    bad = set(self.pos_att_type) - {"c2p", "p2c"}
    if bad:
      raise ValueError(f"Unknown pos_att_type entries {sorted(bad)}.")  # caller's argument
    if self.relative_attention and self.attention != "disentangled":
      raise ValueError("relative_attention needs attention='disentangled'.")  # caller's argument
    if self.relative_attention and self.max_relative_positions < 1:
      # caller's argument
      raise ValueError("relative_attention needs a resolved max_relative_positions >= 1.")
    if self.relative_bias_buckets:
      if self.attention != "dot":
        raise ValueError("relative_bias_buckets needs attention='dot'.")  # caller's argument
      if self.relative_bias_buckets < 4 or self.relative_bias_buckets % 2:
        # caller's argument
        raise ValueError(f"relative_bias_buckets={self.relative_bias_buckets}: an even "
                         "number >= 4 is needed (half per sign, half of those exact).")
      if self.relative_bias_max_distance <= self.relative_bias_buckets // 4:
        # caller's argument
        raise ValueError(f"relative_bias_max_distance={self.relative_bias_max_distance} "
                         f"must exceed the exact offsets ({self.relative_bias_buckets // 4}).")

    if self.local_window < 0 or self.global_every < 1:
      raise ValueError(f"local_window={self.local_window} must be >= 0 and "
                       f"global_every={self.global_every} >= 1.")  # caller's argument
    if self.rotary_theta < 0 or self.rotary_theta_local < 0:
      raise ValueError(f"rotary_theta={self.rotary_theta} and rotary_theta_local="
                       f"{self.rotary_theta_local} must be >= 0 (0: none).")  # caller's argument
    if self.rotary_theta and self.dim_per_head % 2:
      # caller's argument
      raise ValueError(f"Rotary positions need an even head dimension, not {self.dim_per_head}.")
    if (self.rotary_theta or self.local_window) and self.attention != "dot":
      raise ValueError("rotary_theta and local_window need attention='dot'.")  # caller's argument
    if self.rotary_theta_local and not self.rotary_theta:
      # caller's argument
      raise ValueError("rotary_theta_local needs rotary_theta (the global layers' base).")

  def _check_numbers(self) -> None:
    """Sizes are integers and rates finite numbers in range (a config.json value of
    "384", 128.0, true or NaN would otherwise fail deep in Flax, or run)."""
    sizes = dict(vocab_size=1, hidden_size=1, num_layers=1, num_heads=1, intermediate_size=1,
                 max_position_embeddings=1, type_vocab_size=0, embedding_size=0, head_dim=0,
                 pad_token_id=None)
    for field, least in sizes.items():
      value = getattr(self, field)
      if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        # caller's argument
        raise ValueError(f"{field}={value!r} ({type(value).__name__}) must be an integer.")
      if least is not None and value < least:
        raise ValueError(f"{field}={value} must be >= {least}.")  # caller's argument
    rates = dict(layer_norm_eps=(0.0, math.inf), hidden_dropout=(0.0, 1.0),
                 attention_dropout=(0.0, 1.0), probe_dropout=(0.0, 1.0))
    for field, (low, high) in rates.items():
      value = getattr(self, field)
      if not isinstance(value, numbers.Real) or isinstance(value, bool) or not (
          math.isfinite(value) and (low < value if field == "layer_norm_eps" else low <= value)
          and value < high):
        span = "a finite number > 0" if field == "layer_norm_eps" else f"in [{low}, {high})"
        raise ValueError(f"{field}={value!r} must be {span}.")  # caller's argument

  def is_local(self, layer: int) -> bool:
    """Whether `layer` attends within `local_window` (False: every key)."""
    return self.local_window > 0 and layer % self.global_every != 0

  def layer_theta(self, layer: int) -> float:
    """The rotary base of `layer` (0: no rotary positions)."""
    if self.is_local(layer) and self.rotary_theta_local:
      return self.rotary_theta_local
    return self.rotary_theta

  @property
  def dim_per_head(self) -> int:
    return self.head_dim or self.hidden_size // self.num_heads

  @property
  def embed_dim(self) -> int:
    return self.embedding_size or self.hidden_size

  @property
  def num_hidden_states(self) -> int:
    """Hidden states returned: the embedding output plus one per layer."""
    return self.num_layers + 1

  @property
  def total_heads(self) -> int:
    return self.num_layers * self.num_heads

  @property
  def max_length(self) -> int:
    """Longest input the position embeddings allow (unlimited for relative-only)."""
    if not self.position_biased_input:
      return UNLIMITED
    if self.position_ids == "from_padding":  # Positions start at pad_token_id + 1.
      return self.max_position_embeddings - self.pad_token_id - 1
    return self.max_position_embeddings

  def replace(self, **kwargs: Any) -> EncoderConfig:
    return dataclasses.replace(self, **kwargs)

  def to_dict(self) -> dict[str, Any]:
    d = dataclasses.asdict(self)
    d["pos_att_type"] = list(self.pos_att_type)
    return d

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> EncoderConfig:
    d = dict(d)
    d["pos_att_type"] = tuple(d.get("pos_att_type", ()))
    return cls(**d)

  def architecture_dict(self) -> dict[str, Any]:
    """Fields that decide parameter shapes and numerics (not provenance or recipe).

    Fields added later are left out while at their default, so fingerprints
    recorded before they existed stay valid.
    """
    d = self.to_dict()
    for key in ("name", "family", "hidden_dropout", "attention_dropout", "probe_dropout"):
      d.pop(key)
    if not self.relative_bias_buckets:
      for key in ("relative_bias_buckets", "relative_bias_max_distance"):
        d.pop(key)
    defaults = EncoderConfig(1, 1, 1, 1, 1, 1)
    for key in ("norm_placement", "first_attention_norm", "final_norm", "mlp", "attention_bias",
                "mlp_bias", "norm_bias", "rotary_theta", "rotary_theta_local", "local_window",
                "global_every"):
      if d[key] == getattr(defaults, key):
        d.pop(key)
    return d
