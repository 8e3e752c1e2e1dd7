"""Reading Hugging Face weight files into numpy, without torch for safetensors."""

from __future__ import annotations

import json
import os
from typing import Callable, Iterator, Mapping

import numpy as np

from papa_jax.errors import ModelFileError, ModelNotFound

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PYTORCH_BIN = "pytorch_model.bin"
PYTORCH_BIN_INDEX = "pytorch_model.bin.index.json"


def weight_files(model_dir: str) -> list[str]:
  """The weight files of a model directory, preferring safetensors."""
  for index in (SAFETENSORS_INDEX, PYTORCH_BIN_INDEX):
    path = os.path.join(model_dir, index)
    if os.path.isfile(path):
      shards = sorted(set(_weight_map(path).values()))
      files = [os.path.join(model_dir, s) for s in shards]
      missing = [f for f in files if not os.path.isfile(f)]
      if missing:
        raise ModelNotFound(f"{index} names missing shard files: {missing}")
      return files
  for name in (SAFETENSORS, PYTORCH_BIN):
    path = os.path.join(model_dir, name)
    if os.path.isfile(path):
      return [path]
  onnx = sorted(f for f in os.listdir(model_dir) if f.lower().endswith(".onnx"))
  hint = (f" It holds {onnx}: to load an ONNX export, give the .onnx file's path as the "
          "model (config.json is not read for it)." if onnx else "")
  raise ModelNotFound(
      f"{model_dir!r} has no {SAFETENSORS} or {PYTORCH_BIN} (nor a sharded "
      f"index of either).{hint}"
  )


def read_json_object(path: str) -> dict:
  """A JSON file holding an object (config.json, an index); ValueError naming the file
  when it is not UTF-8, not JSON, or not an object."""
  try:
    with open(path, encoding="utf-8") as f:
      obj = json.load(f)
  except json.JSONDecodeError as e:
    raise ModelFileError(f"{path} is not valid JSON: {e}") from e
  except UnicodeDecodeError as e:
    raise ModelFileError(f"{path} is not UTF-8 (byte offset {e.start}: "
                     f"{e.object[e.start:e.end]!r}).") from None
  if not isinstance(obj, dict):
    raise ModelFileError(f"{path} holds a JSON {type(obj).__name__}, not an object of fields.")
  return obj


def _weight_map(path: str) -> dict[str, str]:
  """The `weight_map` (tensor name -> shard file) of a sharded checkpoint's index."""
  weight_map = read_json_object(path).get("weight_map")
  if not isinstance(weight_map, dict) or not all(
      isinstance(v, str) for v in weight_map.values()):
    raise ModelFileError(f"{path} has no 'weight_map' object (tensor name -> shard file).")
  return weight_map


class LazyStateDict(Mapping):
  """Tensor name -> numpy array, each read from disk only when accessed."""

  def __init__(self):
    self._loaders: dict[str, Callable[[], np.ndarray]] = {}
    self._files: dict[str, str] = {}

  def add(self, name: str, loader: Callable[[], np.ndarray], path: str = "") -> None:
    """Registers a tensor; a name already registered (two shards) is an error: which copy
    a reader would take is not defined."""
    if name in self._loaders:
      raise ModelFileError(f"Tensor {name} is stored twice: in {self._files[name]} and in {path}.")
    self._loaders[name] = loader
    self._files[name] = path

  def __getitem__(self, name: str) -> np.ndarray:
    return self._loaders[name]()

  def __iter__(self) -> Iterator[str]:
    return iter(self._loaders)

  def __len__(self) -> int:
    return len(self._loaders)


def _read_safetensors(path: str, out: LazyStateDict) -> None:
  from safetensors import SafetensorError, safe_open

  try:
    f = safe_open(path, framework="numpy")
    names = list(f.keys())
  except (SafetensorError, OSError, ValueError) as e:
    raise ModelFileError(f"Could not read safetensors file {path}: {e}") from e

  def loader(name):
    def load():
      try:
        return f.get_tensor(name)
      except Exception as e:  # pylint: disable=broad-except
        # numpy lacks some safetensors dtypes (float8: AttributeError), among others.
        raise ModelFileError(f"Could not read tensor {name} of {path} "
                         f"({type(e).__name__}: {e}).") from e
    return load

  for name in names:
    out.add(name, loader(name), path)


def _read_torch_bin(path: str, out: LazyStateDict) -> None:
  try:
    import torch  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ImportError(
        f"{path} is a PyTorch pickle; reading it needs torch. Install torch "
        "or convert the checkpoint to model.safetensors."
    ) from e
  try:
    state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
  except Exception as e:  # torch raises many types for corrupt files.
    raise ModelFileError(f"Could not read PyTorch checkpoint {path}: {e}") from e

  def loader(v):
    return lambda: (v.detach().to(torch.float32).numpy() if v.is_floating_point()
                    else v.numpy())

  for k, v in state.items():
    out.add(k, loader(v), path)


def read_state_dict(model_dir: str) -> LazyStateDict:
  """All tensors of a model directory, keyed by HF name, read on access."""
  state = LazyStateDict()
  for path in weight_files(model_dir):
    if path.endswith(".safetensors"):
      _read_safetensors(path, state)
    else:
      _read_torch_bin(path, state)
  return state
