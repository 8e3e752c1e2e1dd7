"""Context mixing beyond attention: norms, rollout, ALTI, GlobEnc, value zeroing.

Pure functions of one post-LayerNorm layer's captured intermediates
(`Capture(probs, transformed_values, head_outputs, attention_output,
layer_norms)`) and its parameters, batched over examples and exact up to
float32 (`shared/spec/context_mixing.md`; symbols of its §2.1: x the layer's
input, alpha the probabilities, f = v W_O per head, z_ij = sum_h alpha_ij f_j,
u = x + sum_j z_ij + b_O, s1 = sqrt(var u + eps), h = LN1(u), r = h + FFN(h),
s2, out = LN2(r)). Every `[B, N, N]` output is exactly 0 on pad rows and pad
columns; rows are normalised over real keys only, and a row whose total is 0
stays 0. Memory stays bounded: norms use Gram matrices `[B, N, H, H]` in the
LayerNorm metric (no `[N, N, d]` tensor), ALTI and value zeroing chunk over
query rows or zeroed tokens.

  * `head_norms`: Kobayashi et al. (2020) `alpha^h_ij ||f^h_j||`, `[B, H, N, N]`;
  * `summed_norms(kind)`: `||z_ij||` ("attn"), with the residual ("attnres"),
    with the residual and LN1 ("attnresln"), and GlobEnc's N-Enc ("enc": LN2 too);
  * `mixing_ratios(kind)`: Kobayashi et al. (2021)'s `||sum_{j != i} w_ij|| /
    (||sum_{j != i} w_ij|| + ||w_ii||)`, `[B, N]`;
  * `alti`: Ferrando et al. (2022)'s contributions, `[B, N, N]`;
  * `value_zeroing`: Mohebbi et al. (2023), `[B, N, N]`, by the exact tail form
    `out_i^{not j} = Phi(u_i - z_ij)` (§7.2), vectorised over the zeroed token;
  * `rollout`: Abnar & Zuidema (2020) over layers (`residual=0.5` for attention,
    None for contribution matrices that hold the residual already).
The methods built from these, by name (what the API, the mixing stage and the explorer
compute): `papa_jax/measures/mixing_methods.py`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from papa_jax.models.capture import Capture, LayerIntermediates
from papa_jax.models.config import EncoderConfig
from papa_jax.models.encoder import activation
from papa_jax.errors import ConfigError

Array = jax.Array
CAPTURE = Capture(probs=True, transformed_values=True, head_outputs=True, attention_output=True,
                  layer_norms=True)
KINDS = ("attn", "attnres", "attnresln", "enc")
HIGHEST = jax.lax.Precision.HIGHEST


def check_decomposable(config: EncoderConfig) -> None:
  """Raises ValueError naming the property when the decompositions here would not be exact.

  They follow a post-LayerNorm layer (LN1 after the attention residual, LN2 after
  the MLP's); dense or gated MLPs and absent biases (zeros) are exact.
  """
  if config.norm_placement != "post":
    raise ConfigError(f"Context mixing decomposes post-LayerNorm layers (LN1 on x + attention, "
                     f"LN2 on h + MLP); this {config.family or 'model'} has norm_placement="
                     f"{config.norm_placement!r}: not implemented (the numbers would be wrong).")


def _bias(p: dict, like: Array) -> Array:
  """A layer's bias, or zeros where the model has none (`attention_bias`, `norm_bias`...)."""
  return p["bias"] if "bias" in p else jnp.zeros(like.shape[-1:], like.dtype)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LayerTerms:
  """What every measure of one layer reads: masked alpha, f, x, u, the LN pieces, params."""

  alpha: Array  # [B, H, N, N], zero on pad rows and columns.
  f: Array  # [B, H, N, D]: v W_O per head.
  x: Array  # [B, N, D]: the layer's input.
  zsum: Array  # [B, N, D]: sum_j z_ij (the attention output without b_O).
  u: Array  # [B, N, D]: LN1's input.
  s1: Array  # [B, N]
  s2: Array  # [B, N]
  mask: Array  # [B, N] float (1: real token).
  params: Any  # This layer's parameters (LN1, FFN, LN2, output projection).
  ln: bool = dataclasses.field(default=True, metadata=dict(static=True))  # False: no LN maps.

  @property
  def gamma1(self) -> Array:
    return self.params["attention_norm"]["scale"]

  @property
  def gamma2(self) -> Array:
    return self.params["output_norm"]["scale"]


def layer_terms(layer: LayerIntermediates, x: Array, mask: Array, params) -> LayerTerms:
  """The terms of one layer from its captured intermediates (`CAPTURE`) and parameters."""
  m = mask.astype(jnp.float32)
  alpha = layer.probs * m[:, None, :, None] * m[:, None, None, :]
  zsum = layer.attention_output - params["attention"].get("out_bias", 0.0)
  return LayerTerms(alpha, layer.transformed_values, x, zsum, layer.attention_norm_input,
                    layer.attention_norm_scale, layer.output_norm_scale, m, params)


def _center(w: Array) -> Array:
  return w - jnp.mean(w, -1, keepdims=True)


def metric(t: LayerTerms, kind: str):
  """The linear map K of a kind (applied to vectors `[..., D]`) and its scale `[B, N]`."""
  if kind in ("attn", "attnres") or not t.ln:  # Without LN (hand-made tests): identity.
    if kind not in KINDS:
      raise ValueError(f"kind {kind!r}; choose one of {KINDS}.")  # caller's argument
    return (lambda w: w), jnp.ones_like(t.s1)
  if kind == "attnresln":
    return (lambda w: t.gamma1 * _center(w)), t.s1
  if kind == "enc":
    return (lambda w: t.gamma2 * _center(t.gamma1 * _center(w))), t.s1 * t.s2
  raise ValueError(f"kind {kind!r}; choose one of {KINDS}.")  # caller's argument


def head_norms(t: LayerTerms) -> Array:
  """`alpha^h_ij ||f^h_j||` (exact since alpha >= 0): `[B, H, N, N]`."""
  return t.alpha * jnp.linalg.norm(t.f, axis=-1)[:, :, None, :]


def summed_norms(t: LayerTerms, kind: str) -> Array:
  """`||K(z_ij + [residual] delta_ij x_i)|| / s_i` per kind, `[B, N, N]`, from Gram matrices."""
  k, scale = metric(t, kind)
  kf = k(t.f)  # [B, H, N, D]
  gram = jnp.einsum("bhjd,bgjd->bjhg", kf, kf, precision=HIGHEST)
  q = jnp.einsum("bhij,bgij,bjhg->bij", t.alpha, t.alpha, gram, precision=HIGHEST)
  if kind != "attn":  # The residual joins the diagonal: + 2 <K z_ii, K x_i> + ||K x_i||^2.
    kx = k(t.x)
    cross = jnp.einsum("bhi,bhid,bid->bi", jnp.diagonal(t.alpha, axis1=-2, axis2=-1), kf, kx,
                       precision=HIGHEST)
    q = q + jnp.eye(q.shape[-1])[None] * (2 * cross + jnp.sum(kx * kx, -1))[:, :, None]
  pair = t.mask[:, :, None] * t.mask[:, None, :]
  return jnp.sqrt(jnp.maximum(q, 0.0)) / jnp.where(scale > 0, scale, 1.0)[:, :, None] * pair


def mixing_ratios(t: LayerTerms, kind: str) -> Array:
  """Kobayashi et al. (2021)'s mixing ratio per real token, `[B, N]` (0 on padding)."""
  k, _ = metric(t, kind)
  diag = jnp.einsum("bhi,bhid->bid", jnp.diagonal(t.alpha, axis1=-2, axis2=-1), t.f,
                    precision=HIGHEST)  # z_ii
  off = t.zsum - diag
  if kind != "attn":
    diag = diag + t.x
  a, b = jnp.linalg.norm(k(off), axis=-1), jnp.linalg.norm(k(diag), axis=-1)
  return jnp.where(a + b > 0, a / jnp.where(a + b > 0, a + b, 1.0), 0.0) * t.mask


def normalize_rows(c: Array, mask: Array) -> Array:
  """Rows over real keys summed to 1; pad rows, pad columns and empty rows stay 0."""
  c = c * mask[:, :, None] * mask[:, None, :]
  total = jnp.sum(c, -1, keepdims=True)
  return jnp.where(total > 0, c / jnp.where(total > 0, total, 1.0), 0.0)


def _chunked(fn, n: int, chunk: int, axis: int) -> Array:
  """`fn(start)` for starts 0, c, 2c, ... (c = min(chunk, n)) run one after the other by
  `lax.map` (so only one chunk's intermediates are alive), concatenated along `axis` and
  cut to n. `fn` reads its slices with `_window` from arrays padded by `_pad`."""
  c = max(1, min(chunk, n))
  parts = jax.lax.map(fn, jnp.arange(0, -(-n // c) * c, c))  # [k, ..., c, ...]
  parts = jnp.moveaxis(parts, 0, axis)  # [..., k, c, ...]
  shape = parts.shape[:axis] + (parts.shape[axis] * parts.shape[axis + 1],) + parts.shape[
      axis + 2:]
  return jax.lax.slice_in_dim(parts.reshape(shape), 0, n, axis=axis)


def _pad(x: Array, n: int, chunk: int, axis: int, value: float = 0.0) -> Array:
  """`x` padded along `axis` from n to a multiple of min(chunk, n)."""
  c = max(1, min(chunk, n))
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, -(-n // c) * c - n)
  return jnp.pad(x, widths, constant_values=value)


def _window(x: Array, start, n: int, chunk: int, axis: int) -> Array:
  return jax.lax.dynamic_slice_in_dim(x, start, max(1, min(chunk, n)), axis=axis)


def alti(t: LayerTerms, *, chunk: int = 16, reference_quirks: bool = False) -> Array:
  """ALTI contributions `[B, N, N]` (row-normalised over real keys), chunked over queries.

  `T_i(x_j) = K1(z_ij + delta_ij x_i) / s1_i`, `y_i = sum_j T_i(x_j) + K1 b_O / s1_i +
  beta1`, `c_ij ∝ max(0, ||y_i||_1 - ||y_i - T_i(x_j)||_1)`. `reference_quirks`
  reproduces mt-upc's code: the LN scale without eps and the L1 distance of
  `T - y + 1e-6` (§5.2).
  """
  k, s1 = metric(t, "attnresln")
  if reference_quirks and t.ln:
    s1 = jnp.sqrt(jnp.var(t.u, -1))
  out_bias = t.params["attention"].get("out_bias", jnp.zeros_like(t.x[0, 0]))
  bias = k(out_bias) / s1[..., None]
  if t.ln:
    bias = bias + _bias(t.params["attention_norm"], t.x)
  kx = k(t.x) / s1[..., None]
  kf = k(t.f)  # K is linear: K z_ij = sum_h alpha^h_ij K f^h_j.
  n = t.alpha.shape[-1]
  shift = 1e-6 if reference_quirks else 0.0
  alpha_p, s1_p = _pad(t.alpha, n, chunk, 2), _pad(s1, n, chunk, 1, 1.0)
  kx_p, bias_p = _pad(kx, n, chunk, 1), _pad(bias, n, chunk, 1)

  def rows(start):  # Query rows start .. start + c.
    win = lambda x, axis: _window(x, start, n, chunk, axis)
    tz = jnp.einsum("bhij,bhjd->bijd", win(alpha_p, 2), kf,
                    precision=HIGHEST) / win(s1_p, 1)[:, :, None, None]  # [B, c, N, D]
    eye = jax.nn.one_hot(start + jnp.arange(tz.shape[1]), n)[None, :, :, None]
    tz = tz + eye * win(kx_p, 1)[:, :, None, :]
    y = jnp.sum(tz * t.mask[:, None, :, None], 2) + win(bias_p, 1)  # [B, c, D]
    d = jnp.sum(jnp.abs(tz - y[:, :, None, :] + shift), -1)
    return jnp.maximum(jnp.sum(jnp.abs(y), -1)[..., None] - d, 0.0)  # [B, c, N]

  return normalize_rows(_chunked(rows, n, chunk, axis=1), t.mask)


def layer_tail(config: EncoderConfig, params, u: Array) -> Array:
  """`Phi(u) = LN2(LN1(u) + MLP(LN1(u)))`: the position-wise rest of a post-LN layer
  (the MLP dense, `W2 act(W1 h)`, or gated, `W2 (act(W1 h) * U h)`)."""
  check_decomposable(config)
  eps = config.layer_norm_eps

  def ln(w, p):
    mu = jnp.mean(w, -1, keepdims=True)
    var = jnp.mean((w - mu) ** 2, -1, keepdims=True)
    return (w - mu) / jnp.sqrt(var + eps) * p["scale"] + _bias(p, w)

  def dense(w, p):
    y = jnp.dot(w, p["kernel"], precision=HIGHEST)
    return y + p["bias"] if "bias" in p else y

  h = ln(u, params["attention_norm"])
  f = activation(config.hidden_act)(dense(h, params["intermediate"]))
  if config.mlp == "gated":
    f = f * dense(h, params["up"])
  return ln(h + dense(f, params["output"]), params["output_norm"])


def cosine_distance(a: Array, b: Array) -> Array:
  """`1 - cos(a, b)` as `||a/|a| - b/|b|||^2 / 2` (no cancellation for close vectors)."""
  unit = lambda w: w / jnp.maximum(jnp.linalg.norm(w, axis=-1, keepdims=True), 1e-30)
  return 0.5 * jnp.sum((unit(a) - unit(b)) ** 2, -1)


def value_zeroing(t: LayerTerms, config: EncoderConfig, *, chunk: int = 8,
                  normalize: bool = True) -> Array:
  """Value zeroing `[B, N, N]`: row i, column j is the cosine distance between token i's
  output and its output with token j's values zeroed in every head, by the exact tail
  form `Phi(u_i - z_ij)`; rows normalised over real keys unless `normalize=False`."""
  tail = functools.partial(layer_tail, config, t.params) if t.ln else (lambda w: w)
  clean = tail(t.u)  # [B, N, D]
  n = t.alpha.shape[-1]
  alpha_p, f_p = _pad(t.alpha, n, chunk, 3), _pad(t.f, n, chunk, 2)

  def cols(start):  # Zeroed tokens start .. start + c.
    z = jnp.einsum("bhij,bhjd->bijd", _window(alpha_p, start, n, chunk, 3),
                   _window(f_p, start, n, chunk, 2), precision=HIGHEST)  # [B, N, c, D]: z_ij.
    return cosine_distance(tail(t.u[:, :, None, :] - z), clean[:, :, None, :])  # [B, N, c]

  raw = _chunked(cols, n, chunk, axis=2) * t.mask[:, :, None] * t.mask[:, None, :]
  return normalize_rows(raw, t.mask) if normalize else raw


def attention_matrix(t: LayerTerms) -> Array:
  """The head mean of alpha on the real block, rows renormalised: rollout's layer matrix."""
  return normalize_rows(jnp.mean(t.alpha, 1), t.mask)


def rollout(mats: list[Array] | tuple[Array, ...], mask: Array,
            residual: float | None = 0.5) -> list[Array]:
  """`R_1 = A_1`, `R_l = A_l R_{l-1}` with `A = (1 - residual) M + residual I` (rows
  renormalised) or `M` itself (`residual=None`); returns every layer's `R_l`."""
  m = mask.astype(jnp.float32)
  eye = jnp.eye(m.shape[-1])[None] * m[:, :, None]
  out, r = [], None
  for mat in mats:
    a = mat if residual is None else normalize_rows((1 - residual) * mat + residual * eye, m)
    r = a if r is None else jnp.einsum("bij,bjk->bik", a, r, precision=HIGHEST)
    out.append(r)
  return out
