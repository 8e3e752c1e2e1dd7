"""Reading Hugging Face weight files into numpy, without torch for safetensors."""

from __future__ import annotations

import json
import os
from typing import Callable, Iterator, Mapping

import numpy as np

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PYTORCH_BIN = "pytorch_model.bin"
PYTORCH_BIN_INDEX = "pytorch_model.bin.index.json"


def weight_files(model_dir: str) -> list[str]:
  """The weight files of a model directory, preferring safetensors."""
  for index in (SAFETENSORS_INDEX, PYTORCH_BIN_INDEX):
    path = os.path.join(model_dir, index)
    if os.path.isfile(path):
      with open(path) as f:
        shards = sorted(set(json.load(f)["weight_map"].values()))
      files = [os.path.join(model_dir, s) for s in shards]
      missing = [f for f in files if not os.path.isfile(f)]
      if missing:
        raise FileNotFoundError(f"{index} names missing shard files: {missing}")
      return files
  for name in (SAFETENSORS, PYTORCH_BIN):
    path = os.path.join(model_dir, name)
    if os.path.isfile(path):
      return [path]
  raise FileNotFoundError(
      f"{model_dir!r} has no {SAFETENSORS} or {PYTORCH_BIN} (nor a sharded "
      "index of either)."
  )


class LazyStateDict(Mapping):
  """Tensor name -> numpy array, each read from disk only when accessed."""

  def __init__(self):
    self._loaders: dict[str, Callable[[], np.ndarray]] = {}

  def add(self, name: str, loader: Callable[[], np.ndarray]) -> None:
    self._loaders[name] = loader

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
    raise ValueError(f"Could not read safetensors file {path}: {e}") from e

  def loader(name):
    def load():
      try:
        return f.get_tensor(name)
      except (SafetensorError, OSError, ValueError) as e:
        raise ValueError(f"Could not read tensor {name} of {path}: {e}") from e
    return load

  for name in names:
    out.add(name, loader(name))


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
    raise ValueError(f"Could not read PyTorch checkpoint {path}: {e}") from e

  def loader(v):
    return lambda: (v.detach().to(torch.float32).numpy() if v.is_floating_point()
                    else v.numpy())

  for k, v in state.items():
    out.add(k, loader(v))


def read_state_dict(model_dir: str) -> LazyStateDict:
  """All tensors of a model directory, keyed by HF name, read on access."""
  state = LazyStateDict()
  for path in weight_files(model_dir):
    if path.endswith(".safetensors"):
      _read_safetensors(path, state)
    else:
      _read_torch_bin(path, state)
  return state
