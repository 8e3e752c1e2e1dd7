"""Linguistic features (Sun & Marasovic's fig. 7): attention to part-of-speech classes.

Per layer and head, raw beside effective attention, for two query choices:
the [CLS] row, and every real row averaged. For each class, over the
examples that have a token of it: the attention *mass* the query gives to
the class's tokens (their sum) and the *max* over them (the reference code's
statistic). Effective attention is signed; both are reported signed.

Classes come from gold tags at each word's first word piece (continuation
pieces are OTHER), [CLS] and [SEP] from the token ids:
  * Penn Treebank (CoNLL-2003 `pos`): NN NNS -> NOUN; NNP NNPS -> PROPN;
    PRP PRP$ WP WP$ -> PRON; VB VBD VBG VBN VBP VBZ -> VERB (MD stays OTHER,
    as UD's AUX); . , : `` '' ( ) " -> PUNCT; everything else OTHER.
  * Universal Dependencies UPOS (`udpos`): NOUN, PROPN, PRON, VERB, PUNCT
    map to themselves; everything else (AUX included) OTHER.
NOUN excludes proper nouns, as spaCy's coarse `NOUN` tag the reference used.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from papa_jax import head_maps
from papa_jax.measures import effective
from papa_jax import runner
from papa_jax.analysis import figures, per_head
from papa_jax.data.preprocess import IGNORE
from papa_jax.errors import ConfigError
from papa_jax.stage import Setup

CLASSES = ("CLS", "SEP", "NOUN", "PROPN", "PRON", "VERB", "PUNCT", "OTHER")
PAD = -1
PTB = {"NN": "NOUN", "NNS": "NOUN", "NNP": "PROPN", "NNPS": "PROPN", "PRP": "PRON",
       "PRP$": "PRON", "WP": "PRON", "WP$": "PRON", "VB": "VERB", "VBD": "VERB",
       "VBG": "VERB", "VBN": "VERB", "VBP": "VERB", "VBZ": "VERB", ".": "PUNCT", ",": "PUNCT",
       ":": "PUNCT", "``": "PUNCT", "''": "PUNCT", "(": "PUNCT", ")": "PUNCT", '"': "PUNCT"}
UPOS = {t: t for t in ("NOUN", "PROPN", "PRON", "VERB", "PUNCT")}


def tag_class(tag: str) -> str:
  """The class of a Penn Treebank or UPOS tag (see the module docstring)."""
  return PTB.get(tag) or UPOS.get(tag) or "OTHER"


def class_ids(input_ids: np.ndarray, mask: np.ndarray, labels: np.ndarray,
              label_names, cls_id: int, sep_id: int) -> np.ndarray:
  """Per token: an index into CLASSES, or -1 for padding.

  `labels` are the tagging task's `[N, L]` tag ids at each word's first word
  piece (IGNORE elsewhere), as `data.preprocess.encode` lays them out.
  """
  lookup = np.array([CLASSES.index(tag_class(t)) for t in label_names], np.int32)
  cat = np.full(input_ids.shape, CLASSES.index("OTHER"), np.int32)
  first = labels != IGNORE
  cat[first] = lookup[labels[first]]
  cat[input_ids == sep_id] = CLASSES.index("SEP")
  cat[input_ids == cls_id] = CLASSES.index("CLS")
  cat[mask == 0] = PAD
  return cat


def _query_stats(X, onehot, present, row_weights):
  """Mass and max per class for weighted query rows: `[B, H, C]` each."""
  mass = jnp.einsum("bhqk,bkc->bhqc", X, onehot)
  neg = jnp.finfo(X.dtype).min
  mx = jnp.max(jnp.where(onehot[:, None, None] > 0, X[..., None], neg), axis=-2)  # [B,H,Q,C]
  mx = jnp.where(present[:, None, None, :], mx, 0.0)
  w = row_weights[:, None, :, None]
  return jnp.sum(mass * w, 2), jnp.sum(mx * w, 2)


@dataclasses.dataclass(frozen=True)
class Linguistic(per_head.PerHeadAnalysis):
  """Attention mass and max per class, from the [CLS] row and from all rows."""

  rtol: float | None = None
  name: ClassVar[str] = "linguistic"
  columns: ClassVar[tuple[str, ...]] = CLASSES
  infos: ClassVar = {f"{q}_{s}_{k}": head_maps.HeadInfo(
      f"{'[CLS] row' if q == 'cls' else 'every row'}: {s} of {k} attention per word class")
                     for q in ("cls", "rows") for s in ("mass", "max") for k in ("raw", "eff")}

  @classmethod
  def from_setup(cls, setup: Setup) -> Linguistic:
    rtol = setup.config.effective.rtol
    return cls(rtol if rtol > 0 else None)

  def arrays(self, setup: Setup, data) -> dict[str, np.ndarray]:
    if setup.task.kind != "tagging":
      raise ConfigError(
          f"stage=linguistic needs gold part-of-speech tags: a tagging task such as pos "
          f"(CoNLL-2003, Penn Treebank) or udpos (UPOS), not {setup.task.name!r}.")
    tok = setup.tokenizer
    return dict(classes=class_ids(data.input_ids, data.attention_mask, data.labels,
                                  setup.task.label_names, tok.cls_token_id, tok.sep_token_id))

  def stats(self, outs, batch, mask, params) -> dict[str, runner.Weighted]:
    del params
    out = outs[0]
    mf = mask.astype(jnp.float32)
    onehot = jax.nn.one_hot(batch["classes"], len(CLASSES)) * mf[..., None]  # Padding: 0.
    present = (jnp.sum(onehot, 1) > 0).astype(jnp.float32)  # [B, C]: examples with the class.
    cls_row = jax.nn.one_hot(jnp.argmax(batch["classes"] == 0, -1), mask.shape[1]) * mf
    all_rows = mf / jnp.maximum(jnp.sum(mf, -1, keepdims=True), 1.0)
    per_layer = {}
    for a, v in zip(out.attentions, out.values):
      key_mask = jnp.broadcast_to(mf[:, None, :] > 0, a.shape[:-1])
      e = effective.effective_attention(a, v, key_mask, rtol=self.rtol)[0]
      for kind, X in (("raw", a * mf[:, None, None, :]), ("eff", e)):
        for query, rows in (("cls", cls_row), ("rows", all_rows)):
          mass, mx = _query_stats(X, onehot, present > 0, rows)
          for stat, x in (("mass", mass), ("max", mx)):
            per_layer.setdefault(f"{query}_{stat}_{kind}", []).append(x)
    return {k: runner.Weighted(tuple(xs), present) for k, xs in per_layer.items()}

  def finalize(self, totals: runner.Totals) -> dict:
    return dict(totals.means(), count=totals.weights["cls_mass_raw"])

  def summary(self, st: dict, setup: Setup, data) -> dict:
    last = lambda key: dict(zip(CLASSES, np.nanmean(st[key][-1], 0).tolist()))
    return dict(examples=len(data),
                examples_with_class=dict(zip(CLASSES, st["count"].astype(int).tolist())),
                classes=list(CLASSES), last_layer_cls_mass_raw=last("cls_mass_raw"),
                last_layer_cls_mass_eff=last("cls_mass_eff"))

  def figures(self, st: dict, summary: dict, setup: Setup, data) -> None:
    for query in ("cls", "rows"):
      panels = [(f"{kind}: {query} -> {cls}", st[f"{query}_mass_{kind}"][..., i])
                for kind in ("raw", "eff") for i, cls in enumerate(CLASSES)]
      figures.head_maps(panels, setup.layout.figure(self.name, f"{query}_mass.png"),
                        per_head.label(setup, f"attention mass to each class ({query} query)",
                                       len(data)), ncols=len(CLASSES), center=True,
                        cmap="RdBu_r")


STAGE = per_head.stage(Linguistic)
