"""Architecture description shared by every encoder family."""

from __future__ import annotations

import dataclasses
from typing import Any

FAMILIES = ("bert", "roberta", "electra", "distilbert", "deberta", "deberta-v2")
ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish")


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
  """Hyper-parameters of a pretrained encoder, independent of its source.

  Attributes mirror Hugging Face names where they exist. `family` selects the
  embedding and attention variant; the DeBERTa fields are ignored elsewhere.
  """

  family: str
  vocab_size: int
  hidden_size: int
  num_layers: int
  num_heads: int
  intermediate_size: int
  max_position_embeddings: int
  type_vocab_size: int = 2
  embedding_size: int = 0  # 0 means hidden_size.
  head_dim: int = 0  # 0 means hidden_size // num_heads.
  hidden_act: str = "gelu"
  layer_norm_eps: float = 1e-12
  hidden_dropout: float = 0.1
  attention_dropout: float = 0.1
  pad_token_id: int = 0
  # Absolute position embeddings are added to the input (all but DeBERTa
  # checkpoints with position_biased_input=False).
  position_biased_input: bool = True
  # DeBERTa.
  relative_attention: bool = False
  pos_att_type: tuple[str, ...] = ()
  max_relative_positions: int = -1
  position_buckets: int = -1
  share_att_key: bool = False
  norm_rel_ebd: bool = False
  name: str = ""  # Provenance only (a path or hub id); not architecture.

  def __post_init__(self):
    if self.family not in FAMILIES:
      raise ValueError(
          f"Unsupported encoder family {self.family!r}; supported: {FAMILIES}."
      )
    if self.hidden_act not in ACTIVATIONS:
      raise ValueError(
          f"Unsupported activation {self.hidden_act!r}; supported: "
          f"{ACTIVATIONS}."
      )
    if not self.head_dim and self.hidden_size % self.num_heads:
      raise ValueError(
          f"hidden_size {self.hidden_size} is not a multiple of num_heads "
          f"{self.num_heads}."
      )
    bad = set(self.pos_att_type) - {"c2p", "p2c"}
    if bad:
      raise ValueError(f"Unknown pos_att_type entries {sorted(bad)}.")

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
  def is_deberta(self) -> bool:
    return self.family in ("deberta", "deberta-v2")

  @property
  def max_length(self) -> int:
    """Longest input the position embeddings allow (inf for relative-only)."""
    if self.is_deberta and not self.position_biased_input:
      return 1 << 30
    if self.family == "roberta":  # Positions start at pad_token_id + 1.
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
    """Fields that decide parameter shapes and numerics (not provenance)."""
    d = self.to_dict()
    d.pop("name")
    d.pop("hidden_dropout")
    d.pop("attention_dropout")
    return d
