"""Change through fine-tuning (Sun & Marasovic's fig. 5, after Kovaleva et al.).

Per layer and head, averaged over the examples of a split (mask-aware: only
real query rows and real keys count):
  * cosine similarity of the flattened real-token blocks of the pretrained
    model's and the fine-tuned model's attention, for raw and for effective
    attention;
  * Jensen-Shannon divergence (natural log) between the two models' raw
    attention rows, averaged over real query rows (raw rows are
    distributions; effective rows are not, so they get the cosine only).
A model compared with itself gives cosine 1 and JS 0 on every head.
"""

from __future__ import annotations

import jax.numpy as jnp

from papa_jax.analysis import effective
from papa_jax.analysis.stats import _js
from papa_jax.models.config import EncoderConfig
from papa_jax.models.encoder import Encoder

PER_HEAD = ("cos_raw", "cos_eff", "js_raw")


class ArchitectureMismatch(ValueError):
  """The two models cannot be compared head by head."""


def check_comparable(a: EncoderConfig, b: EncoderConfig, tokenizer_difference: str | None
                     ) -> None:
  """Same architecture (field by field) and tokenizers that give the same ids."""
  da, db = a.architecture_dict(), b.architecture_dict()
  diff = sorted(k for k in da if da[k] != db.get(k))
  if diff:
    raise ArchitectureMismatch(
        "The two models differ in architecture, so their heads cannot be compared: "
        + "; ".join(f"{k}: {da[k]!r} vs {db.get(k)!r}" for k in diff[:8]) + ".")
  if tokenizer_difference:
    raise ArchitectureMismatch(
        f"The two models' tokenizers differ ({tokenizer_difference}): the same text would "
        "give them different inputs.")


def _cosine(x, y, block):
  num = jnp.sum(x * y * block, (-1, -2))
  den = jnp.sqrt(jnp.sum(x * x * block, (-1, -2)) * jnp.sum(y * y * block, (-1, -2)))
  return num / jnp.maximum(den, 1e-30)


def make_batch_stats(config: EncoderConfig, rtol: float | None = None):
  """`((params_a, params_b), batch) -> sums [layers, H]` per statistic, and the count."""
  module = Encoder(config)

  def fn(params, batch):
    m = batch["attention_mask"] * batch["valid"][:, None]
    outs = [module.apply({"params": p}, batch["input_ids"], m, batch["token_type_ids"],
                         capture_attention=True, capture_values=True) for p in params]
    mf = m.astype(jnp.float32)
    block = mf[:, None, :, None] * mf[:, None, None, :]
    rows = jnp.broadcast_to(mf[:, None, :] > 0, outs[0].attentions[0].shape[:-1])  # [B, H, L]
    n_rows = jnp.maximum(jnp.sum(rows, -1), 1)
    w = batch["valid"].astype(jnp.float32)[:, None]
    sums = {k: [] for k in PER_HEAD}
    for a, b, va, vb in zip(outs[0].attentions, outs[1].attentions, outs[0].values,
                            outs[1].values):
      ea = effective.effective_attention(a, va, rows, rtol=rtol)[0]
      eb = effective.effective_attention(b, vb, rows, rtol=rtol)[0]
      js = jnp.sum(jnp.where(rows, _js(a * block, b * block), 0.0), -1) / n_rows
      for k, x in (("cos_raw", _cosine(a, b, block)), ("cos_eff", _cosine(ea, eb, block)),
                   ("js_raw", js)):
        sums[k].append(jnp.sum(x * w, 0))
    out = {k: jnp.stack(v) for k, v in sums.items()}
    out["count"] = jnp.sum(w)
    return out

  return fn


def finalize(sums: dict) -> dict:
  count = float(sums["count"])
  return dict({k: sums[k] / max(count, 1.0) for k in PER_HEAD}, count=count)

