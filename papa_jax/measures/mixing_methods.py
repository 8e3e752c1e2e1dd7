"""Every context-mixing method, by name: the one list the API, the mixing stage and the explorer
read (`METHODS`).

A method is one `MixingMethod` record: the per-layer map it computes from a layer's terms
(`mixing.layer_terms`), how it is rolled out over the layers, the explorer's description
of its maps, the mixing stage's name for it and its per-head form, and what it costs.
`api.context_mixing` computes any of them, the `mixing` stage (`analysis/mixing_stats.py`)
averages the ones `mixing.methods` selects, and the explorer stores the per-layer ones
(`explorer/collect.py`); the config's lists (`config_fields.MIXING_METHODS`,
`EXPLORE_MIXING`) equal what is here (tests/mixing_test.py). Adding a method is one
function in `mixing.py` and one entry here (docs/context_mixing.md, "Adding a method").
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax

from papa_jax.measures import mixing
from papa_jax.models.config import EncoderConfig

ROLLOUT = "_rollout"  # `<method>_rollout`: the method's maps rolled out over the layers.


@dataclasses.dataclass(frozen=True)
class Options:
  """The settings a method's map may read (the `mixing` config group's)."""

  alti_chunk: int = 16  # Query rows per ALTI chunk.
  vz_chunk: int = 8  # Zeroed tokens per value-zeroing chunk.
  reference_quirks: bool = False  # ALTI as mt-upc's code computes it.


@dataclasses.dataclass(frozen=True)
class MixingMethod:
  """One context-mixing method.

  Attributes:
    name: its name in `api.context_mixing` (and the explorer's `explore.mixing`).
    layer: `(terms, config, options)` -> one layer's map `[B, N, N]` (`[B, H, N, N]` when
      `heads`), exactly 0 on pad rows and columns.
    label: the explorer's description of the layer map; "" for a map it does not show.
    heads: the map has a head axis (a per-head map: not one of the explorer's).
    normalized: its rows sum to 1 over the real keys (else the stage reports row shares).
    rollout: it is rolled out over the layers (`<name>_rollout`, `mixing.rollout`), with
      `residual` (0.5 for attention; None for contribution maps that hold the residual).
    rollout_label: the explorer's description of the rolled-out map.
    stage: its name in `mixing.methods` (the stage's self-contributions and rollouts);
      "" when the stage does not select it.
    ratio: the stage reports its mixing ratio per layer (`mixing.mixing_ratios`, kind `name`).
    head_form: the mixing stage's per-head measure standing for it against head scores
      (`mixing_stats.PER_HEAD`): layer-level maps are built from the head-summed `z_ij`,
      whose per-head part is the head's share of the attention output.
    cost: what computing it takes, against the attention map itself.
  """

  name: str
  layer: Callable[[mixing.LayerTerms, EncoderConfig, Options], jax.Array]
  label: str
  head_form: str
  cost: str
  heads: bool = False
  normalized: bool = False
  rollout: bool = False
  residual: float | None = None
  rollout_label: str = ""
  stage: str = ""
  ratio: bool = False


_NORMS = "per-token H x H Gram matrices in the LayerNorm metric (no [N, N, D] tensor)"

METHODS: dict[str, MixingMethod] = {m.name: m for m in (
    MixingMethod(
        "attention", lambda t, c, o: mixing.attention_matrix(t), normalized=True, rollout=True,
        residual=0.5, head_form="attention_self", cost="none: the captured probabilities",
        label="attention: the head mean of α, rows renormalised over the real tokens",
        rollout_label="attention rollout (Abnar & Zuidema 2020): the product over the layers "
                      "up to this one of 0.5 A + 0.5 I, A the head-mean attention"),
    MixingMethod(
        "head_norms", lambda t, c, o: mixing.head_norms(t), heads=True, label="",
        head_form="norm_mass", cost="one norm per value vector; [B, layers, H, N, N] out"),
    MixingMethod(
        "attn", lambda t, c, o: mixing.summed_norms(t, "attn"), ratio=True,
        head_form="norm_mass", cost=_NORMS,
        label="Attn-N (Kobayashi et al. 2020): ||Σ_h α^h_ij f^h_j||, attention weighted by "
              "the norms of the transformed values"),
    MixingMethod(
        "attnres", lambda t, c, o: mixing.summed_norms(t, "attnres"), ratio=True,
        head_form="head_share", cost=_NORMS,
        label="AttnRes-N (Kobayashi et al. 2021): Attn-N with the residual on the diagonal"),
    MixingMethod(
        "attnresln", lambda t, c, o: mixing.summed_norms(t, "attnresln"), ratio=True,
        stage="norms", head_form="head_share", cost=_NORMS,
        label="AttnResLn-N (Kobayashi et al. 2021): the norm of token j's part of token i's "
              "vector through attention, the residual and the first LayerNorm"),
    MixingMethod(
        "globenc", lambda t, c, o: mixing.summed_norms(t, "enc"), rollout=True, stage="globenc",
        head_form="head_share", cost=_NORMS,
        label="GlobEnc's N-Enc (Modarressi et al. 2022): AttnResLn-N through both LayerNorms, "
              "this layer alone",
        rollout_label="GlobEnc (Modarressi et al. 2022): N-Enc rolled out over the layers up "
                      "to this one (unnormalised products)"),
    MixingMethod(
        "alti", lambda t, c, o: mixing.alti(t, chunk=o.alti_chunk,
                                            reference_quirks=o.reference_quirks),
        normalized=True, rollout=True, stage="alti", head_form="head_share",
        cost="[B, chunk, N, D] per chunk of query rows (mixing.alti_chunk)",
        label="ALTI (Ferrando et al. 2022): token j's contribution to token i's output of this "
              "layer, by L1 distances; rows sum to 1",
        rollout_label="ALTI rollout: each input token's contribution to token i after this "
                      "layer"),
    MixingMethod(
        "value_zeroing", lambda t, c, o: mixing.value_zeroing(t, c, chunk=o.vz_chunk),
        normalized=True, rollout=True, stage="value_zeroing", head_form="head_share",
        cost="the layer's FFN once per zeroed token, in chunks (mixing.vz_chunk): the costly one",
        label="value zeroing (Mohebbi et al. 2023): how far token i's output moves (cosine "
              "distance) when token j's values are zeroed in every head; rows sum to 1",
        rollout_label="value zeroing rollout: the product over the layers up to this one"),
)}
NAMES = tuple(METHODS)
# `mixing.methods`: the stage's selectable methods (attention's rollout it always computes).
STAGE_METHODS = tuple(m.stage for m in METHODS.values() if m.stage)
RATIOS = tuple(m.name for m in METHODS.values() if m.ratio)
# Every per-layer map the explorer can store (`explore.mixing`), with its description.
LABELS = {name: label for m in METHODS.values() if m.label for name, label in (
    (m.name, m.label), *(((m.name + ROLLOUT, m.rollout_label),) if m.rollout else ()))}


def staged(selected) -> tuple[MixingMethod, ...]:
  """The methods the stage's `mixing.methods` names `selected` turn on, in registry order."""
  return tuple(m for m in METHODS.values() if m.stage and m.stage in selected)
