"""The `mixing` stage: context-mixing measures averaged over a split's real tokens.

Per layer and head (`papa_jax/measures/mixing.py` for the math):
  * `norm_mass`: Kobayashi et al.'s per-head norm `sum_j alpha^h_ij ||f^h_j||`,
    averaged over real query rows (how much a head moves, not only where);
  * `head_share`: the head's share of the layer's attention output,
    `||sum_j z^h_ij|| / sum_g ||sum_j z^g_ij||`, averaged over real query rows;
  * `attention_self`: raw attention's head-mean `alpha^h_ii` (for comparison).
Per layer (`stats.json` "layers", and `layers.csv`): the mean over real tokens
of each method's self-contribution `c_ii` (row-normalised ALTI, value zeroing,
GlobEnc's N-Enc, AttnResLn-N, and attention), of the mixing ratios (attn,
attnres, attnresln) and of the rollouts' self-contribution after the layer
(attention rollout, ALTI and value zeroing rollouts, GlobEnc). How each per-head
measure agrees with PAPA's gates, ablation scores and scored head orderings is
the workdir's one agreement table (`head_maps.workdir_agreement`), shown by the
explorer and the report.
For the layer-level methods (ALTI, GlobEnc, value zeroing) the per-head form
compared is the head's share of the attention output (`head_share`): the
layer matrices of those methods are built from the head-summed vectors
`z_ij = sum_h z^h_ij`, and a head's share of `sum_j z_ij` is the part of them
that head contributes, at no extra cost (a per-head value zeroing would cost
heads x the layer-level one).
"""

from __future__ import annotations

import csv
import dataclasses
import io
from typing import ClassVar

import jax.numpy as jnp
import numpy as np

from papa_jax import head_maps, runner
from papa_jax.measures import mixing, mixing_methods
from papa_jax.workdir import rules as workdir
from papa_jax.analysis import figures, per_head
from papa_jax.errors import ConfigError
from papa_jax.stage import Setup

# `mixing.methods` and the mixing ratios, from the registry (papa_jax/measures/mixing_methods.py);
# attention's rollout always.
METHODS, RATIOS = mixing_methods.STAGE_METHODS, mixing_methods.RATIOS


@dataclasses.dataclass(frozen=True)
class Mixing(per_head.PerHeadAnalysis):
  """Context-mixing measures of every layer, averaged over real tokens."""

  config: object  # The EncoderConfig (static: hashed by value).
  methods: tuple[str, ...] = METHODS
  alti_chunk: int = 16
  vz_chunk: int = 8
  reference_quirks: bool = False
  name: ClassVar[str] = "mixing"
  capture: ClassVar = mixing.CAPTURE
  matmul_precision: ClassVar[str] = "highest"  # The encoder's forward too (spec §2.6).
  groups: ClassVar[tuple[str, ...]] = per_head.ANALYSIS_GROUPS + ("mixing",)
  infos: ClassVar = dict(
      norm_mass=head_maps.HeadInfo("norm mass Σ_j α_ij ||f_j|| (Kobayashi et al. 2020)"),
      head_share=head_maps.HeadInfo("share of the attention output ||Σ_j z^h_ij|| / "
                                    "Σ_g ||Σ_j z^g_ij||"),
      attention_self=head_maps.HeadInfo("attention to self α_ii"))

  @classmethod
  def from_setup(cls, setup: Setup) -> Mixing:
    m, mc = setup.config.mixing, setup.model.config
    if mc.compute_dtype != "float32" and not m.allow_low_precision:
      raise ConfigError("stage=mixing decomposes the layers exactly: run it in float32 "
                        "(--config.model.dtype=float32), or set mixing.allow_low_precision=True "
                        "(the identities then hold to about 1e-2).")
    try:
      mixing.check_decomposable(mc)
    except ValueError as e:
      raise ConfigError(f"stage=mixing: {e}") from e
    return cls(mc, tuple(m.methods), m.alti_chunk, m.vz_chunk, m.reference_quirks)

  def key(self, setup: Setup) -> dict:
    return dict(methods=list(self.methods))

  def stats(self, outs, batch, mask, params) -> dict[str, runner.Weighted]:
    out, p = outs[0], params[0]
    m = mask.astype(jnp.float32)
    n = jnp.maximum(jnp.sum(m, -1), 1.0)
    every = jnp.ones(m.shape[:1], jnp.float32)
    row_mean = lambda v: jnp.sum(v * m[:, None, :] if v.ndim == 3 else v * m, -1) / (
        n[:, None] if v.ndim == 3 else n)  # Mean over real query rows.
    self_of = lambda c: row_mean(jnp.diagonal(c, axis1=-2, axis2=-1))
    per: dict[str, list] = {}
    rolls: dict[str, list] = {}
    options = mixing_methods.Options(self.alti_chunk, self.vz_chunk, self.reference_quirks)
    add = lambda k, v: per.setdefault(k, []).append(v)
    for l, layer in enumerate(out.layers):
      t = mixing.layer_terms(layer, out.hidden_states[l], mask, p[f"layer_{l}"])
      add("norm_mass", row_mean(jnp.sum(mixing.head_norms(t), -1)))
      heads = jnp.linalg.norm(layer.head_outputs, axis=-1) * m[:, None, :]  # [B, H, N]
      add("head_share", row_mean(heads / jnp.maximum(jnp.sum(heads, 1, keepdims=True), 1e-30)))
      add("attention_self", row_mean(jnp.diagonal(t.alpha, axis1=-2, axis2=-1)))
      rolls.setdefault("attention", []).append(mixing.attention_matrix(t))
      for kind in RATIOS:
        add(f"mixing_ratio_{kind}", row_mean(mixing.mixing_ratios(t, kind)))
      for method in mixing_methods.staged(self.methods):  # Row shares of every map.
        c = method.layer(t, self.config, options)
        add(f"self_{method.name}", self_of(c if method.normalized else
                                           mixing.normalize_rows(c, m)))
        if method.rollout:
          rolls.setdefault(method.name, []).append(c)
    for name, mats in rolls.items():
      method = mixing_methods.METHODS[name]
      for r in mixing.rollout(mats, m, residual=method.residual):
        if not method.normalized:  # Unnormalised products (the reference): report row shares.
          r = mixing.normalize_rows(r, m)
        add(f"rollout_self_{name}", self_of(r))
    return {k: runner.Weighted(tuple(v), every) for k, v in per.items()}

  def summary(self, st: dict, setup: Setup, data) -> dict:
    layers = {k: np.asarray(v).tolist() for k, v in st.items() if np.ndim(v) == 1}
    return dict(examples=int(st["count"]), methods=list(self.methods),
                reference_quirks=self.reference_quirks, layers=layers)

  def maps(self, st: dict) -> dict[str, np.ndarray]:
    return {k: v for k, v in st.items() if np.ndim(v) == 2}  # Per head; per layer: layers.csv.

  def write(self, st: dict, summary: dict, setup: Setup, data) -> None:
    super().write(st, summary, setup, data)
    buf = io.StringIO()
    w = csv.writer(buf)
    names = list(summary["layers"])
    w.writerow(["layer"] + names)
    for l in range(self.config.num_layers):
      w.writerow([l] + [f"{summary['layers'][k][l]:.6g}" for k in names])
    with workdir.atomic_write(setup.layout.figure(self.name, "layers.csv"), newline="") as f:
      f.write(buf.getvalue())

  def figures(self, st: dict, summary: dict, setup: Setup, data) -> None:
    title = per_head.label(setup, "context mixing per head", int(st["count"]))
    figures.head_maps([("norm mass (K20)", st["norm_mass"]), ("share of the attention output",
                                                              st["head_share"]),
                       ("attention to self", st["attention_self"])],
                      setup.layout.figure(self.name, "heads.png"), title, cmap="viridis",
                      shared_scale=False)  # Different units per panel.
    lay = summary["layers"]
    pick = lambda prefix: {k[len(prefix):]: v for k, v in lay.items() if k.startswith(prefix)}
    figures.layer_lines([("self-contribution c_ii (rows normalised)", pick("self_")),
                         ("rollout: self after the layer", pick("rollout_self_")),
                         ("mixing ratio (Kobayashi et al. 2021)", pick("mixing_ratio_"))],
                        setup.layout.figure(self.name, "layers.png"),
                        per_head.label(setup, "context mixing per layer", int(st["count"])))


PER_HEAD = tuple(Mixing.infos)  # The per-head maps (the rest are per layer).
STAGE = per_head.stage(Mixing)
