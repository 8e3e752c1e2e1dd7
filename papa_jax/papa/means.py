"""Average attention per (layer, head, query, key) over a dataset split.

`avg[l,h,i,j] = sum_b A_b[l,h,i,j] m_b[i] m_b[j] / sum_b m_b[i] m_b[j]`, 0 where
the count is 0 (`shared/spec/papa.md` §4), a statistic of the analysis runner
(`papa_jax/runner.py`): each device sums its rows of a batch, one psum adds
the devices' sums, and the host adds batches into float64 totals, so memory is
independent of the dataset size and the result equals the single-device one
up to float32 summation order.

File format (`.npz`): `avgs` float32 `[layers, heads, L, L]`, `sums` float64
(same shape), `counts` float64 `[L, L]`, and `metadata`, a JSON string with
`format`, `model`, `model_fingerprint`, `architecture`, `task`, `split`,
`max_length`, `num_examples`, `attention`, `papa_layout`,
`faithful_segment_ids`, `data_fingerprint` (the data config and the content of
the files read, `Setup.data_fingerprint`) and `data_files` (their SHA-256).
The raw pass also stores, in the same pass, what the other constants and the
input-dependence scores need
(`shared/spec/context_mixing.md` §8): `sums_sq` (`sum_b m_i m_j A^2`),
`sums_xlogx` (`sum_b m_i m_j A log A`), `row_sums` (`sum_b m_i A`: each query
row's real keys) and `row_counts` (`sum_b m_i`, `[L, L]`), all float64.
"""

from __future__ import annotations

import dataclasses
import json
import time
import zipfile

import jax.numpy as jnp
import numpy as np
from absl import logging
from jax.scipy.special import xlogy

from papa_jax import parallel
from papa_jax.config import schema as config_schema
from papa_jax.measures import effective
from papa_jax.workdir import resume, storage, rules as workdir
from papa_jax.probing import features as features_lib
from papa_jax import runner
from papa_jax.data import pipeline
from papa_jax.papa import constants
from papa_jax.errors import ConfigError, PapaError
from papa_jax.workdir.layout import RELATIVE
from papa_jax.models.config import EncoderConfig
from papa_jax.models.encoder import DTYPES, Capture
from papa_jax.stage import Setup, Stage

FORMAT = "papa-jax-means/1"
ATTENTION_KINDS = ("raw", "effective")  # The attention a means pass averages.
COMPUTED = ("raw", "effective", "row_mean", "compressed")  # The means stage's variants.
FILE_VARIANTS = COMPUTED + ("optimal",)  # Variants with a means file (optimal: papa/optimal.py).
# What the raw pass adds beside `sums` (see the module docstring).
EXTRAS = ("sums_sq", "sums_xlogx", "row_sums", "row_counts")


class MeansFileError(PapaError, ValueError):
  """A means file that is unreadable or does not fit the run."""


@dataclasses.dataclass(frozen=True)
class AttentionSums:
  """The means pass's statistic: each layer's attention weighted by `m_i m_j`.

  Called by `runner.sum_pass` on every batch; `attention` is "raw" or
  "effective" (each head's effective attention, mask-aware). The raw pass also
  sums `A^2` and `A log A` over the same pairs and `A` over each real query's
  row (`EXTRAS`).
  """

  attention: str = "raw"

  def __post_init__(self):
    if self.attention not in ATTENTION_KINDS:
      raise ConfigError(f"means attention must be one of {ATTENTION_KINDS}, not "
                       f"{self.attention!r}.")

  @property
  def capture(self) -> Capture:
    return Capture(probs=True, values=self.attention == "effective")

  def __call__(self, outs, batch, mask, params) -> dict[str, runner.Weighted]:
    del batch, params
    out = outs[0]
    m = mask.astype(jnp.float32)
    layers = out.attentions
    if self.attention == "effective":
      key_mask = jnp.broadcast_to(m[:, None, :] > 0, layers[0].shape[:-1])
      layers = tuple(effective.effective_attention(a, v, key_mask)[0]
                     for a, v in zip(layers, out.values))
    pair = m[:, :, None] * m[:, None, :]
    out = {"attention": runner.Weighted(tuple(layers), pair)}
    if self.attention == "raw":
      rows = jnp.broadcast_to(m[:, :, None], pair.shape)  # m_i: the query is real.
      out.update(attention_sq=runner.Weighted(tuple(a * a for a in layers), pair),
                 attention_xlogx=runner.Weighted(tuple(xlogy(a, a) for a in layers), pair),
                 attention_rows=runner.Weighted(tuple(layers), rows))
    return out


@dataclasses.dataclass(frozen=True)
class HiddenStates:
  """Per-example rows of the means pass: the stacked hidden states `[B, K, L, D]`
  in `dtype`, the baseline probe's features from the same forward."""

  dtype: str

  def __call__(self, outs, batch):
    del batch
    return jnp.stack(outs[0].hidden_states, axis=1).astype(DTYPES[self.dtype])


@dataclasses.dataclass
class MeansState:
  """Totals of a means pass: `sums [layers, H, L, L]`, pair `counts [L, L]` (float64),
  and for the raw pass the `EXTRAS`."""

  sums: np.ndarray
  counts: np.ndarray
  num_examples: int = 0
  features: np.ndarray | None = None  # Hidden states of every example, when collected.
  extras: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)

  def averages(self) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
      avg = self.sums / self.counts
    return np.nan_to_num(avg, nan=0.0, posinf=0.0, neginf=0.0).astype(np.float32)


def accumulate(config: EncoderConfig, params, data, mesh, *, batch_size: int,
               attention: str = "raw", partial: str = "", run_key: str = "",
               checkpoint_every: int = 0, desc: str = "",
               feature_dtype: str | None = None) -> MeansState:
  """The means pass: every batch's masked sums added into float64 host totals.

  Args:
    config, params: the encoder.
    data: the split (`Encoded` or a dict of arrays), held by every process.
    mesh: the data mesh.
    batch_size: the global batch size (the result does not depend on it
      beyond float32 summation order).
    attention: "raw" or "effective".
    partial, run_key, checkpoint_every: resuming (`runner.sum_pass`).
    desc: progress label.
    feature_dtype: also collect every example's stacked hidden states in this
      dtype into `features` (single-process runs that start at batch 0).
  """
  stat = AttentionSums(attention)
  totals = runner.sum_pass(
      stat, stat.capture, config, (params,), data, mesh, batch_size=batch_size, partial=partial,
      run_key=run_key, checkpoint_every=checkpoint_every, desc=desc,
      rows_fn=HiddenStates(feature_dtype) if feature_dtype is not None else None)
  L = pipeline.columns(data)["input_ids"].shape[1]
  if not totals.sums:  # No batch at all.
    return MeansState(np.zeros((config.num_layers, config.num_heads, L, L)), np.zeros((L, L)))
  extras = {}
  if "attention_sq" in totals.sums:
    extras = dict(sums_sq=totals.sums["attention_sq"], sums_xlogx=totals.sums["attention_xlogx"],
                  row_sums=totals.sums["attention_rows"],
                  row_counts=totals.weights["attention_rows"])
  return MeansState(totals.sums["attention"], totals.weights["attention"], totals.examples,
                    totals.rows, extras)


def save_means(path: str, state: MeansState, metadata: dict,
               avgs: np.ndarray | None = None) -> None:
  """Writes a means file (`avgs` default: the state's averages)."""
  meta = dict(metadata, format=FORMAT, num_examples=state.num_examples)
  with workdir.atomic_write(path, "wb") as f:
    np.savez(f, avgs=state.averages() if avgs is None else avgs.astype(np.float32),
             sums=state.sums, counts=state.counts,
             metadata=np.asarray(json.dumps(meta, sort_keys=True)), **state.extras)


@dataclasses.dataclass
class Means:
  """A means file: the constant matrices `avgs`, their sums and counts, metadata, extras."""

  avgs: np.ndarray
  sums: np.ndarray
  counts: np.ndarray
  metadata: dict
  extras: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)

  def extra(self, name: str, path: str = "") -> np.ndarray:
    """One of `EXTRAS`, or a clear error when the file predates it."""
    if name not in self.extras:
      raise MeansFileError(
          f"{path or 'This means file'} has no {name!r}: it was written before the raw pass "
          "stored the sums the input-dependence scores and the row-mean constants need. "
          "Delete it (or rerun with --config.overwrite=True) to compute them.")
    return self.extras[name]


def load_means(path: str, *, fingerprint: str | None = None,
               max_length: int | None = None, shape: tuple | None = None) -> Means:
  """Loads a means file, checking it fits the model and length of this run."""
  if not storage.exists(path):
    raise MeansFileError(f"Means file {path} does not exist; run the 'means' stage first.")
  try:
    with np.load(storage.readable(path), allow_pickle=False) as z:
      m = Means(z["avgs"], z["sums"], z["counts"], json.loads(str(z["metadata"])),
                {k: z[k] for k in EXTRAS if k in z.files})
  except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError) as e:
    raise MeansFileError(f"Means file {path} is corrupt or truncated ({type(e).__name__}: "
                         f"{e}); delete it and rerun the 'means' stage.") from e
  meta = m.metadata
  if meta.get("format") != FORMAT:
    raise MeansFileError(f"{path} has format {meta.get('format')!r}, expected {FORMAT!r}.")
  if max_length is not None and meta.get("max_length") != max_length:
    raise MeansFileError(f"{path} holds means for max_length={meta.get('max_length')}, but "
                         f"this run uses max_length={max_length}; they must be equal.")
  if fingerprint is not None and meta.get("model_fingerprint") != fingerprint:
    raise MeansFileError(f"{path} was computed with another model ({meta.get('model')}, "
                         f"fingerprint {meta.get('model_fingerprint')}); this run's model "
                         f"has fingerprint {fingerprint}.")
  if shape is not None and tuple(m.avgs.shape) != tuple(shape):
    raise MeansFileError(f"{path} has avgs of shape {m.avgs.shape}; expected {shape}.")
  if not np.all(np.isfinite(m.avgs)):
    raise MeansFileError(f"{path} contains non-finite averages.")
  return m


# The means stage.


def metadata(setup: Setup, variant: str) -> dict:
  """What a means file of this run records (and `load_checked` compares)."""
  c, d, mc = setup.config, setup.config.data, setup.model.config
  return dict(model=c.model.name, model_fingerprint=setup.model_fingerprint,
              architecture=mc.architecture_dict(), task=setup.task.name, split="train",
              max_length=setup.max_length, attention=variant, papa_layout=d.papa_layout,
              faithful_segment_ids=d.faithful_segment_ids,
              data_fingerprint=setup.data_fingerprint(("train",)),
              data_files=setup.file_hashes(setup.sources(("train",))))


def load_checked(setup: Setup, variant: str) -> Means:
  """This run's means file of `variant`, checked to fit the model, length and data."""
  mc, L = setup.model.config, setup.max_length
  path = setup.layout.means(variant)
  m = load_means(path, fingerprint=setup.model_fingerprint, max_length=L,
                 shape=(mc.num_layers, mc.num_heads, L, L))
  want = metadata(setup, variant)
  for key in ("attention", "data_fingerprint"):
    if m.metadata.get(key) != want[key]:
      raise MeansFileError(
          f"{path} was computed with {key}={m.metadata.get(key)!r}, this run has "
          f"{want[key]!r} (other data: the data config or the content of "
          f"{_files_changed(m.metadata, want)}).")
  return m


def _files_changed(saved: dict, want: dict) -> str:
  """The data files whose hashes differ between two means metadata (or all of this run's)."""
  old, new = saved.get("data_files", {}), want["data_files"]
  changed = [p for s, files in new.items() for p, h in files.items()
             if old.get(s, {}).get(p) != h]
  return ", ".join(changed or [p for files in new.values() for p in files])


def constant_matrices(setup: Setup, variant: str) -> np.ndarray:
  """The `[layers, heads, L, L]` constants of a variant (`papa/constants.py`), checked."""
  if variant == "uniform":
    mc = setup.model.config
    return constants.uniform(mc.num_layers, mc.num_heads, setup.max_length)
  return load_checked(setup, variant).avgs


def _check(setup: Setup) -> None:
  for v in setup.variants:
    if v in FILE_VARIANTS and storage.exists(setup.layout.means(v)):
      load_checked(setup, v)  # Raises if it does not fit.


def _pass(setup: Setup, variant: str) -> MeansState:
  """A means pass over the train data (resumable); keeps the baseline's features."""
  c = setup.config
  meta = metadata(setup, variant)
  partial = setup.layout.means_partial(variant)
  # The raw pass is the baseline's forward over the same examples: keep its
  # hidden states as the baseline probe's cached train features, where they are kept in
  # memory (else the probe stage computes them into its files: memory stays bounded).
  reuse = (c.probe.cache_features and variant == "raw"
           and not features_lib.run_cache_folder(setup))
  state = accumulate(
      setup.model.config, setup.model.params, setup.train_data, setup.mesh,
      batch_size=c.run.batch_size, attention=variant, partial=partial,
      run_key=workdir.fingerprint(dict(meta, batch_size=c.run.batch_size,
                                       examples=len(setup.train_data))),
      checkpoint_every=c.run.checkpoint_every_batches, desc=f"means ({variant})",
      feature_dtype=c.probe.feature_dtype if reuse else None)
  if state.features is not None:
    setup.baseline_train_features = features_lib.Features(
        state.features, setup.train_data.attention_mask, setup.train_data.labels)
  if parallel.is_main_process():
    resume.remove(partial)
  return state


def _derived(setup: Setup, variant: str) -> tuple[MeansState, np.ndarray, dict]:
  """A variant computed from the raw means file: its state, matrices and metadata."""
  path = setup.layout.means("raw")
  raw = load_checked(setup, "raw")
  n = raw.metadata.get("num_examples", 0)
  if variant == "row_mean":
    sums, counts = raw.extra("row_sums", path), raw.extra("row_counts", path)
    return MeansState(sums, counts, n), constants.row_mean(sums, counts), {}
  p, info = constants.fit_compressed(raw.avgs, raw.counts)
  return MeansState(p.astype(np.float64), raw.counts, n), p, dict(fit=info)


def _run(setup: Setup) -> None:
  for variant in setup.variants:
    path = setup.layout.means(variant)
    if variant not in COMPUTED:
      continue  # Uniform: no file; optimal: its own stage.
    if storage.exists(path):
      load_checked(setup, variant)
      logging.info("means (%s): %s exists; skipping.", variant, path)
      continue
    t0 = time.perf_counter()
    meta = metadata(setup, variant)
    if variant in ATTENTION_KINDS:
      state, avgs = _pass(setup, variant), None
    else:
      state, avgs, more = _derived(setup, variant)
      meta.update(more)
    if parallel.is_main_process():
      save_means(path, state, meta, avgs)
    logging.info("means (%s): %d examples in %.1fs -> %s", variant, state.num_examples,
                 time.perf_counter() - t0, path)


STAGE = Stage(name="means", run=_run, inputs=("train",), writes=(RELATIVE.means("*"),),
              groups=config_schema.PAPA_GROUPS, check=_check, memory="capture")
