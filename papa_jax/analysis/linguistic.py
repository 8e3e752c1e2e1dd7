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

import jax
import jax.numpy as jnp
import numpy as np

from papa_jax.analysis import effective
from papa_jax.data.preprocess import IGNORE
from papa_jax.models.config import EncoderConfig
from papa_jax.models.encoder import Encoder

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


def make_batch_stats(config: EncoderConfig, rtol: float | None = None):
  """`(params, batch) -> sums [layers, H, C]` per (query, statistic, attention)."""
  module = Encoder(config)
  C = len(CLASSES)

  def fn(params, batch):
    m = batch["attention_mask"] * batch["valid"][:, None]
    out = module.apply({"params": params}, batch["input_ids"], m, batch["token_type_ids"],
                       capture_attention=True, capture_values=True)
    mf = m.astype(jnp.float32)
    onehot = jax.nn.one_hot(batch["classes"], C) * mf[..., None]  # Padding: all zero.
    present = jnp.sum(onehot, 1) > 0  # [B, C]
    w = batch["valid"].astype(jnp.float32)
    weight = present.astype(jnp.float32) * w[:, None]  # Examples that have the class.
    cls_row = jax.nn.one_hot(jnp.argmax(batch["classes"] == 0, -1), m.shape[1]) * mf
    all_rows = mf / jnp.maximum(jnp.sum(mf, -1, keepdims=True), 1.0)
    sums = {}
    for a, v in zip(out.attentions, out.values):
      key_mask = jnp.broadcast_to(mf[:, None, :] > 0, a.shape[:-1])
      e = effective.effective_attention(a, v, key_mask, rtol=rtol)[0]
      for kind, X in (("raw", a * mf[:, None, None, :]), ("eff", e)):
        for query, rows in (("cls", cls_row), ("rows", all_rows)):
          mass, mx = _query_stats(X, onehot, present, rows)
          for stat, x in (("mass", mass), ("max", mx)):
            sums.setdefault(f"{query}_{stat}_{kind}", []).append(jnp.sum(x * weight[:, None], 0))
    out_sums = {k: jnp.stack(v) for k, v in sums.items()}
    out_sums["count"] = jnp.sum(weight, 0)  # [C]: examples having each class.
    return out_sums

  return fn


def finalize(sums: dict) -> dict:
  count = np.asarray(sums["count"], np.float64)
  out = {k: np.where(count > 0, v / np.maximum(count, 1.0), np.nan)
         for k, v in sums.items() if k != "count"}
  out["count"] = count
  return out
