"""What the encoder returns: hidden states and, per layer, the intermediates asked for.

`Capture` is the typed spec (flax gemma's `SowConfig`), `LayerIntermediates`
one layer's record (a registered dataclass; big_vision's `vit.py` returns its
named intermediates the same way), `EncoderOutput` the whole result.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class Capture:
  """Which per-layer intermediates the encoder returns (flax gemma's `SowConfig`).

  What is not captured costs nothing under jit. Shapes, per layer:
    probs: attention probabilities `[B, H, L, L]` (after the override).
    values: value vectors with bias `[B, H, L, d]` (after "values" interventions).
    transformed_values: `v W_O` per head, `[B, H, L, D]` (Kobayashi et al.'s f(x)).
    head_outputs: each head's share of the attention output, `(A v) W_O` per
      head, `[B, H, L, D]` (summed over heads plus the bias: `attention_output`).
    attention_output: the attention block's output before dropout and the
      residual, `[B, L, D]`.
    context: each head's output before the output projection (`A v`), `[B, H, L, d]`.
    mlp_output: the MLP's output before dropout and the residual, `[B, L, D]`.
    residual_in, residual_out: the layer's input and output `[B, L, D]` (the hidden
      states, but the last layer's before a final LayerNorm).
  Each is recorded after any intervention at the site of the same name
  (`attention.SITES`).
    layer_norms: the LayerNorm inputs and scales: `attention_norm_input` (the
      residual sum `x + attention_output`, `[B, L, D]`), `attention_norm_scale`
      (`sqrt(var + eps)`, `[B, L]`), `attention_norm_output` (`[B, L, D]`),
      `output_norm_input` (`h + FFN(h)`, `[B, L, D]`) and `output_norm_scale`;
      post-LayerNorm layers only (a pre-LN model, e.g. ModernBERT, refuses it).
  """

  probs: bool = False
  values: bool = False
  transformed_values: bool = False
  head_outputs: bool = False
  attention_output: bool = False
  layer_norms: bool = False
  context: bool = False
  mlp_output: bool = False
  residual_in: bool = False
  residual_out: bool = False

  @classmethod
  def everything(cls) -> Capture:
    return cls(*(True for _ in dataclasses.fields(cls)))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LayerIntermediates:
  """One layer's captured intermediates (see `Capture`); None where not captured."""

  probs: Array | None = None
  values: Array | None = None
  transformed_values: Array | None = None
  head_outputs: Array | None = None
  attention_output: Array | None = None
  attention_norm_input: Array | None = None
  attention_norm_scale: Array | None = None
  attention_norm_output: Array | None = None
  output_norm_input: Array | None = None
  output_norm_scale: Array | None = None
  context: Array | None = None
  mlp_output: Array | None = None
  residual_in: Array | None = None
  residual_out: Array | None = None


class EncoderOutput(NamedTuple):
  """Per-layer results; tuples are indexed by layer.

  Attributes:
    hidden_states: `num_layers + 1` arrays `[B, L, D]`, embeddings first.
    layers: one `LayerIntermediates` per layer when anything is captured,
      else None.
  """

  hidden_states: tuple[Array, ...]
  layers: tuple[LayerIntermediates, ...] | None = None

  @property
  def last_hidden_state(self) -> Array:
    return self.hidden_states[-1]

  def per_layer(self, name: str) -> tuple[Array, ...] | None:
    """A `LayerIntermediates` field of every layer (e.g. "head_outputs"), or None."""
    if self.layers is None or getattr(self.layers[0], name) is None:
      return None
    return tuple(getattr(layer, name) for layer in self.layers)

  @property
  def attentions(self) -> tuple[Array, ...] | None:
    """Every layer's probabilities `[B, H, L, L]` when captured, else None."""
    return self.per_layer("probs")

  @property
  def values(self) -> tuple[Array, ...] | None:
    """Every layer's value vectors `[B, H, L, head_dim]` when captured, else None."""
    return self.per_layer("values")
