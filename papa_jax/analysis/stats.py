"""Raw vs effective attention statistics per (layer, head), summed over a split.

For each example, layer and head, averaged over the example's real query rows:
  * mass on each token category (CLS, SEP, punctuation, other) for raw and
    effective attention (effective mass is signed, as in the reference code);
  * Jensen-Shannon divergence between a raw row and the effective row clipped
    at zero and renormalised (effective attention is not a distribution:
    rows whose clipped mass is zero are skipped);
  * over the example's real block: Pearson correlation of A and A_eff, the
    relative null norm ||A - A_eff||_F / ||A||_F, and the numerical rank.
Every statistic is summed over examples per device and reduced with one psum
(`parallel.sharded_sum`, like the attention means) twice: over all examples
and over the "long" examples whose real length exceeds the head dimension
(the only ones where A_eff != A).
"""

from __future__ import annotations

import unicodedata

import jax
import jax.numpy as jnp
import numpy as np

from papa_jax.analysis import effective
from papa_jax.models.config import EncoderConfig
from papa_jax.models.encoder import Encoder

CATEGORIES = ("cls", "sep", "punct", "other")
PAD = -1
PER_HEAD = ("mass_raw", "mass_eff", "js", "corr", "null_ratio", "rank")


def is_punctuation(token: str) -> bool:
  core = token.lstrip("#").lstrip("Ġ▁")
  return bool(core) and all(unicodedata.category(ch).startswith("P") for ch in core)


def category_ids(input_ids: np.ndarray, mask: np.ndarray, tokenizer) -> np.ndarray:
  """Per token: 0 CLS, 1 SEP, 2 punctuation, 3 other, -1 padding."""
  vocab = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
  punct = np.array([is_punctuation(t or "") for t in vocab])
  cat = np.full(input_ids.shape, 3, np.int32)
  cat[punct[input_ids]] = 2
  cat[input_ids == tokenizer.sep_token_id] = 1
  cat[input_ids == tokenizer.cls_token_id] = 0
  cat[mask == 0] = PAD
  return cat


def _js(p, q):
  m = 0.5 * (p + q)
  kl = lambda a: jnp.sum(jnp.where(a > 0, a * (jnp.log(jnp.where(a > 0, a, 1.0))
                                              - jnp.log(jnp.where(m > 0, m, 1.0))), 0.0), -1)
  return 0.5 * kl(p) + 0.5 * kl(q)


def head_stats(A, E, mask, cat, rank):
  """Per-example statistics `[B, H, ...]` for one layer."""
  m = mask.astype(jnp.float32)
  n = jnp.maximum(jnp.sum(m, -1), 1.0)  # [B]
  onehot = jax.nn.one_hot(cat, len(CATEGORIES))  # [B, L, C]; padding is all-zero.
  qm = m[:, None, :, None]

  def mass(X):
    per_row = jnp.einsum("bhqk,bkc->bhqc", X, onehot)
    return jnp.sum(per_row * qm, 2) / n[:, None, None]

  pos = jnp.maximum(E, 0.0) * m[:, None, None, :]
  total = jnp.sum(pos, -1, keepdims=True)
  q = pos / jnp.where(total > 0, total, 1.0)
  p = A * m[:, None, None, :]
  rows = (total[..., 0] > 0) & (m[:, None, :] > 0)
  js = jnp.sum(jnp.where(rows, _js(p, q), 0.0), -1) / jnp.maximum(jnp.sum(rows, -1), 1)
  block = (m[:, None, :, None] * m[:, None, None, :])
  cnt = jnp.maximum(jnp.sum(block, (-1, -2)), 1.0)  # Padding examples: no 0/0.
  mean_a = jnp.sum(A * block, (-1, -2)) / cnt
  mean_e = jnp.sum(E * block, (-1, -2)) / cnt
  da, de = (A - mean_a[..., None, None]) * block, (E - mean_e[..., None, None]) * block
  corr = jnp.sum(da * de, (-1, -2)) / jnp.sqrt(jnp.maximum(
      jnp.sum(da * da, (-1, -2)) * jnp.sum(de * de, (-1, -2)), 1e-30))
  null = jnp.sqrt(jnp.sum(((A - E) * block) ** 2, (-1, -2))) / jnp.sqrt(
      jnp.maximum(jnp.sum((A * block) ** 2, (-1, -2)), 1e-30))
  return dict(mass_raw=mass(A * block), mass_eff=mass(E), js=js, corr=corr, null_ratio=null,
              rank=rank.astype(jnp.float32))


def make_batch_stats(config: EncoderConfig, rtol: float | None = None):
  """`(params, batch) -> dict of sums [layers, H, ...]` over all and long examples."""
  module = Encoder(config)
  d = config.dim_per_head

  def fn(params, batch):
    m = batch["attention_mask"] * batch["valid"][:, None]
    out = module.apply({"params": params}, batch["input_ids"], m, batch["token_type_ids"],
                       capture_attention=True, capture_values=True)
    w_all = batch["valid"].astype(jnp.float32)
    w_long = w_all * (jnp.sum(m, -1) > d)
    sums = {f"{k}/{s}": [] for k in PER_HEAD for s in ("all", "long")}
    for a, v in zip(out.attentions, out.values):
      key_mask = jnp.broadcast_to(m[:, None, :] > 0, a.shape[:-1])
      e, info = effective.effective_attention(a, v, key_mask, rtol=rtol)
      st = head_stats(a, e, m, batch["categories"], info.rank)
      for k, x in st.items():
        wshape = (-1,) + (1,) * (x.ndim - 1)
        sums[f"{k}/all"].append(jnp.sum(x * w_all.reshape(wshape), 0))
        sums[f"{k}/long"].append(jnp.sum(x * w_long.reshape(wshape), 0))
    out_sums = {k: jnp.stack(v) for k, v in sums.items()}
    out_sums["count/all"], out_sums["count/long"] = jnp.sum(w_all), jnp.sum(w_long)
    return out_sums

  return fn


def finalize(sums: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Means from sums: `{stat}/{all,long}` -> arrays, counts kept."""
  out = {}
  for key, v in sums.items():
    if key.startswith("count/"):
      out[key] = float(v)
      continue
    subset = key.split("/")[1]
    c = float(sums[f"count/{subset}"])
    out[key] = v / c if c else np.full_like(v, np.nan)
  return out
