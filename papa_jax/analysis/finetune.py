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

import dataclasses
from typing import ClassVar

import jax.numpy as jnp
import numpy as np

from papa_jax import convert, head_maps, tokenization
from papa_jax.measures import effective
from papa_jax.workdir import input_files
from papa_jax import runner
from papa_jax.analysis import figures, per_head
from papa_jax.analysis.effective_stats import js_divergence
from papa_jax.errors import ConfigError, PapaError
from papa_jax.models.config import EncoderConfig
from papa_jax.stage import Setup, model_files

PER_HEAD = ("cos_raw", "cos_eff", "js_raw")


class ArchitectureMismatch(PapaError, ValueError):
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


@dataclasses.dataclass(frozen=True)
class Finetune(per_head.PerHeadAnalysis):
  """`model.name` vs `finetune.other_model`, head by head."""

  other_model: str
  rtol: float | None = None
  name: ClassVar[str] = "finetune"
  groups: ClassVar[tuple[str, ...]] = per_head.ANALYSIS_GROUPS + ("finetune",)
  memory: ClassVar[str] = "forward"
  infos: ClassVar = dict(
      cos_raw=head_maps.HeadInfo("cosine of raw attention, pretrained vs fine-tuned"),
      cos_eff=head_maps.HeadInfo("cosine of effective attention, pretrained vs fine-tuned"),
      js_raw=head_maps.HeadInfo("JS divergence of raw attention rows, pretrained vs "
                                "fine-tuned", unit="nats"))

  @classmethod
  def from_setup(cls, setup: Setup) -> Finetune:
    other = setup.config.finetune.other_model
    if not other:
      raise ConfigError("stage=finetune needs finetune.other_model, the fine-tuned (or "
                        "other) checkpoint to compare with.")
    rtol = setup.config.effective.rtol
    return cls(other, rtol if rtol > 0 else None)

  def params(self, setup: Setup) -> tuple:
    other = convert.load_pretrained(self.other_model,
                                    compute_dtype=setup.model.config.compute_dtype)
    check_comparable(setup.model.config, other.config,
                     tokenization.tokenization_difference(setup.tokenizer, other.tokenizer()))
    return (setup.model.params, other.params)

  def key(self, setup: Setup) -> dict:
    """The other model by the content of its files: partial sums of other weights are
    never resumed."""
    files = model_files(self.other_model)
    return dict(other=self.other_model,
                other_files=input_files.content(input_files.source_record(files)))

  def stats(self, outs, batch, mask, params) -> dict[str, runner.Weighted]:
    del params
    mf = mask.astype(jnp.float32)
    block = mf[:, None, :, None] * mf[:, None, None, :]
    rows = jnp.broadcast_to(mf[:, None, :] > 0, outs[0].attentions[0].shape[:-1])  # [B, H, L]
    n_rows = jnp.maximum(jnp.sum(rows, -1), 1)
    per_layer = {k: [] for k in PER_HEAD}
    for a, b, va, vb in zip(outs[0].attentions, outs[1].attentions, outs[0].values,
                            outs[1].values):
      ea = effective.effective_attention(a, va, rows, rtol=self.rtol)[0]
      eb = effective.effective_attention(b, vb, rows, rtol=self.rtol)[0]
      js = jnp.sum(jnp.where(rows, js_divergence(a * block, b * block), 0.0), -1) / n_rows
      for k, x in (("cos_raw", _cosine(a, b, block)), ("cos_eff", _cosine(ea, eb, block)),
                   ("js_raw", js)):
        per_layer[k].append(x)
    every = jnp.ones(mask.shape[:1], jnp.float32)
    return {k: runner.Weighted(tuple(xs), every) for k, xs in per_layer.items()}

  def summary(self, st: dict, setup: Setup, data) -> dict:
    return dict(other_model=self.other_model, examples=int(st["count"]),
                **{f"mean_{k}": float(np.mean(st[k])) for k in PER_HEAD})

  def figures(self, st: dict, summary: dict, setup: Setup, data) -> None:
    title = per_head.label(setup, f"vs {convert.short_name(self.other_model)}",
                           int(st["count"]))
    figures.head_maps([("cosine, raw", st["cos_raw"]), ("cosine, effective", st["cos_eff"])],
                      setup.layout.figure(self.name, "cosine.png"), title, cmap="magma")
    figures.head_maps([("JS divergence, raw", st["js_raw"])],
                      setup.layout.figure(self.name, "js.png"), title, cmap="magma")


STAGE = per_head.stage(Finetune)
