"""Every jitted program of every registered stage, exported for TPU and CUDA from a CPU run.

    python tests/lowering_capture.py OUT.json WORK [--dtype bfloat16] [--families]
    python tests/lowering_capture.py OUT.json WORK --plant STAGE

`jax.jit` is replaced, before the package is imported, by one that records each call's
arguments (shapes, dtypes and shardings; static arguments as values) under the stage that
made it. Every registered stage then runs on SPLADE-tiny at tiny sizes (SST-2, and CoNLL POS
for the linguistic stage), and with `--families` each family's encoder programs (the means
pass, effective attention, context mixing, the probe's features with constant heads) run on a
random checkpoint of that family, at `--dtype` (model.dtype; default float32). Steps that differ by
platform are chosen when a program is lowered (`papa_jax/backend.py`), so the programs traced
here are the accelerators' own. Each recorded program (up to
`PER_FUNCTION` argument signatures per function and stage) is then checked for host callbacks
in its jaxpr and exported with `jax.export` for `PLATFORMS`; OUT.json lists one row per
program: where, function, devices, and the error (host callback with its source line, or the
exception) or the custom calls it lowered to. `--plant STAGE` adds a host callback to the
constant-attention mix inside STAGE (the lowering test's proof that a callback is caught).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import os
import sys
import time
import traceback

import jax

REAL_JIT = jax.jit
PLATFORMS = ("tpu", "cuda")
PER_FUNCTION = 2  # Argument signatures exported per (stage, function).
CALLBACKS = ("pure_callback", "io_callback", "debug_callback", "callback")
WHERE = ["(outside a stage)"]
RAN: list[str] = []  # Every stage that ran (some have no jitted program of their own).
DTYPE = ["float32"]
RECORDS: dict[tuple[str, str, int], dict[str, tuple]] = {}


def _spec(x):
  """An argument leaf as what export needs: arrays as shape, dtype (and sharding)."""
  if isinstance(x, jax.Array):  # An uncommitted array follows the program's devices.
    committed = getattr(x, "_committed", True)
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding if committed else None)
  if hasattr(x, "shape") and hasattr(x, "dtype"):
    return jax.ShapeDtypeStruct(x.shape, x.dtype)
  if isinstance(x, (bool, int, float, complex)):
    return jax.ShapeDtypeStruct((), jax.numpy.result_type(x), weak_type=True)
  return x


def _static(fun, kw) -> tuple[set[int], set[str]]:
  nums = kw.get("static_argnums", ())
  names = kw.get("static_argnames", ())
  nums = {nums} if isinstance(nums, int) else set(nums)
  names = {names} if isinstance(names, str) else set(names)
  try:
    params = list(inspect.signature(fun).parameters)
  except (TypeError, ValueError):
    params = []
  return nums | {params.index(n) for n in names if n in params}, names


def _record(fun, kw, args, kwargs) -> None:
  module = getattr(fun, "__module__", "") or ""
  if not module.startswith("papa_jax"):
    return
  nums, names = _static(fun, kw)
  a = tuple(x if i in nums else jax.tree.map(_spec, x) for i, x in enumerate(args))
  k = {n: (v if n in names else jax.tree.map(_spec, v)) for n, v in kwargs.items()}
  name = f"{module}.{getattr(fun, '__qualname__', repr(fun))}"
  sigs = RECORDS.setdefault((WHERE[0], name, id(fun)), {})  # Closures of one name apart.
  key = repr((a, sorted(k.items())))
  if len(sigs) < PER_FUNCTION and key not in sigs:
    sigs[key] = (fun, kw, a, k)


class Recording:
  """A jitted function that records its calls' arguments (`_record`), then runs."""

  def __init__(self, fun, kw):
    self._fun, self._kw, self._jitted = fun, kw, REAL_JIT(fun, **kw)
    functools.update_wrapper(self, fun)

  def __call__(self, *args, **kwargs):
    _record(self._fun, self._kw, args, kwargs)
    return self._jitted(*args, **kwargs)

  def __getattr__(self, name):
    return getattr(self._jitted, name)

  def __get__(self, obj, objtype=None):
    return self if obj is None else functools.partial(self, obj)


def recording_jit(fun=None, /, **kw):
  if fun is None:
    return functools.partial(recording_jit, **kw)
  return Recording(fun, kw)


jax.jit = recording_jit

# pylint: disable=wrong-import-position
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np  # noqa: E402

from papa_jax import attention, registry, run  # noqa: E402
from tests import hf_oracle  # noqa: E402
from tests.testing import require_shared, tiny_config  # noqa: E402


def _tag_stages(plant: str) -> None:
  """Each stage's calls are recorded under its name; `plant` gets a host callback."""
  for name, s in list(registry.BY_NAME.items()):
    def tagged(setup, _run=s.run, _name=name):
      WHERE[0] = _name
      RAN.append(_name)
      t0 = time.perf_counter()
      try:
        if _name != plant:
          return _run(setup)
        with _planted():
          return _run(setup)
      finally:
        WHERE[0] = "(outside a stage)"
        print(f"stage {_name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    registry.BY_NAME[name] = dataclasses.replace(s, run=tagged)


class _planted:
  """A host callback inside every constant-attention mix while the block runs."""

  def __enter__(self):
    self.real = attention.mask_and_normalize

    def with_callback(x, *a, **k):
      x = jax.pure_callback(np.asarray, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
      return self.real(x, *a, **k)
    attention.mask_and_normalize = with_callback

  def __exit__(self, *exc):
    attention.mask_and_normalize = self.real


def _small(**overrides) -> dict:
  """SPLADE-tiny at tiny sizes in `--dtype` (every run here), with `overrides`."""
  return {"model.name": "splade_tiny", "model.dtype": DTYPE[0], "data.max_length": 16,
          "data.max_train_examples": 32, "data.max_eval_examples": 16, "run.batch_size": 8,
          "probe.epochs": 1, "probe.batch_size": 8, "effective.max_examples": 8,
          "report.n_boot": 100, "papa.fractions": (0.0, 0.5, 1.0), "optimal.epochs": 1,
          "optimal.probe_epochs": 1, **overrides}


def run_stages(work: str) -> None:
  """Every registered stage on SPLADE-tiny, tiny sizes, in three workdirs."""
  small = _small()
  sst2 = os.path.join(work, "sst2")
  common = {"papa.variants": ("raw", "uniform", "optimal"), "patching.max_pairs": 2,
            "mixing.allow_low_precision": DTYPE[0] != "float32"}
  for stage in (s for s in registry.BY_NAME if s != "linguistic"):
    if stage == "finetune":  # Its own workdir: its data layout differs.
      c = tiny_config(work, **small, stage=stage, **{"finetune.other_model": "splade_tiny",
                                                      "data.papa_layout": False})
      run.run(c, os.path.join(work, "finetune"))
    else:
      run.run(tiny_config(work, **small, **common, stage=stage), sst2)
  hidden = tiny_config(work, **small, **common, stage="optimal",
                       **{"optimal.objective": "hidden"})
  run.run(hidden, os.path.join(work, "hidden"))
  pos = tiny_config(work, **small, stage="linguistic", **{"data.task": "pos",
                                                           "data.papa_layout": False})
  pos.data.data_dir = str(require_shared("data", "conll2003"))
  run.run(pos, os.path.join(work, "pos"))


def run_families(work: str) -> None:
  """Each family's encoder programs on a random checkpoint of it (the first architecture)."""
  import papa_jax as pj  # pylint: disable=import-outside-toplevel
  from papa_jax import parallel  # pylint: disable=import-outside-toplevel
  from papa_jax.data import preprocess  # pylint: disable=import-outside-toplevel
  from papa_jax.probing import features, train  # pylint: disable=import-outside-toplevel
  dtype = DTYPE[0]
  mesh = parallel.make_mesh()
  for family in sorted({f for f, _ in hf_oracle._archs().values()}, key=lambda f: f.name):
    arch = next(a for a, (f, _) in hf_oracle._archs().items() if f is family)
    WHERE[0] = f"family {family.name}"
    t0 = time.perf_counter()
    path = os.path.join(work, "families", arch)
    if not os.path.exists(path):
      os.makedirs(path)
      hf_oracle.save_random(arch, __import__("pathlib").Path(path))
    model = pj.load_pretrained(path, compute_dtype=dtype)
    ids, mask = hf_oracle.padded_batch(model.config.vocab_size, (16, 7, 1, 12, 16, 3, 9, 16),
                                       16, model.config.pad_token_id)
    data = preprocess.Encoded(ids.astype(np.int32), mask.astype(np.int32),
                              np.zeros_like(ids, np.int32), np.zeros(len(ids), np.int32))
    raw = pj.attention_means(model, data, batch_size=8, mesh=mesh)
    pj.attention_means(model, data, batch_size=8, mesh=mesh, attention="effective")
    if family.code_path.norm_placement == "post":  # Mixing decomposes post-LN layers only.
      pj.context_mixing(model, data, allow_low_precision=dtype != "float32")
    heads = np.zeros(raw.avgs.shape[:2], bool)
    heads[:, ::2] = True
    override = attention.AttentionOverride.constant(
        jax.numpy.asarray(raw.avgs), tuple(map(tuple, heads.tolist())))
    features.compute(train.FrozenEncoder(model.params, override, model.config), data, mesh, 8)
    print(f"family {family.name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
  WHERE[0] = "(outside a stage)"


def _callbacks(jaxpr) -> list[str]:
  """Host-callback equations anywhere in `jaxpr` (sub-jaxprs too), with their source."""
  from jax._src import source_info_util  # pylint: disable=import-outside-toplevel
  found = []

  def walk(j):
    for eqn in j.eqns:
      if eqn.primitive.name in CALLBACKS:
        found.append(f"{eqn.primitive.name} at {source_info_util.summarize(eqn.source_info)}")
      for v in eqn.params.values():
        for sub in v if isinstance(v, (tuple, list)) else (v,):
          inner = getattr(sub, "jaxpr", sub)
          if hasattr(inner, "eqns"):
            walk(inner)
  walk(getattr(jaxpr, "jaxpr", jaxpr))
  return found


def export_all() -> list[dict]:
  rows = []
  for (where, name, _), sigs in RECORDS.items():
    for fun, kw, args, kwargs in sigs.values():
      row = dict(where=where, function=name, devices=jax.device_count())
      t0 = time.perf_counter()
      try:
        jitted = REAL_JIT(fun, **kw)
        found = _callbacks(jitted.trace(*args, **kwargs).jaxpr)
        if found:
          row["error"] = "host callback: " + "; ".join(found)
        else:
          exp = jax.export.export(jitted, platforms=PLATFORMS)(*args, **kwargs)
          text = exp.mlir_module()
          row["custom_calls"] = sorted({t.split("(")[0] for t in text.split("custom_call @")[1:]})
          row["nr_devices"] = exp.nr_devices
      except Exception as e:  # pylint: disable=broad-except
        row["error"] = f"{type(e).__name__}: {str(e)[:800]}"
        row["traceback"] = traceback.format_exc()[-2000:]
      row["seconds"] = round(time.perf_counter() - t0, 2)
      rows.append(row)
  return rows


def main(argv: list[str]) -> None:
  out, work = argv[1], argv[2]
  plant = argv[argv.index("--plant") + 1] if "--plant" in argv else ""
  if "--dtype" in argv:
    DTYPE[0] = argv[argv.index("--dtype") + 1]
  _tag_stages(plant)
  t0 = time.perf_counter()
  if plant:
    run.run(tiny_config(work, **_small(**{"papa.fractions": (0.0, 1.0)}), stage=plant),
            os.path.join(work, "planted"))
  else:
    run_stages(work)
    if "--families" in argv:
      run_families(work)
  ran = time.perf_counter() - t0
  rows = export_all()
  with open(out, "w", encoding="utf-8") as f:
    json.dump(dict(rows=rows, ran=sorted(set(RAN)), run_seconds=ran,
                   platforms=PLATFORMS, devices=jax.device_count()), f, indent=1)


if __name__ == "__main__":
  main(sys.argv)
