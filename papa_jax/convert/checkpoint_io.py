"""Reading Hugging Face weight files into numpy, without torch for safetensors."""

from __future__ import annotations

import json
import os

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


def _read_safetensors(path: str) -> dict[str, np.ndarray]:
  from safetensors import SafetensorError
  from safetensors.numpy import load_file

  try:
    return load_file(path)
  except (SafetensorError, OSError, ValueError) as e:
    raise ValueError(f"Could not read safetensors file {path}: {e}") from e


def _read_torch_bin(path: str) -> dict[str, np.ndarray]:
  try:
    import torch  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ImportError(
        f"{path} is a PyTorch pickle; reading it needs torch. Install torch "
        "or convert the checkpoint to model.safetensors."
    ) from e
  try:
    state = torch.load(path, map_location="cpu", weights_only=True)
  except Exception as e:  # torch raises many types for corrupt files.
    raise ValueError(f"Could not read PyTorch checkpoint {path}: {e}") from e
  return {k: v.detach().to(torch.float32).numpy() if v.is_floating_point()
          else v.numpy() for k, v in state.items()}


def read_state_dict(model_dir: str) -> dict[str, np.ndarray]:
  """All tensors of a model directory as numpy arrays, keyed by HF name."""
  state: dict[str, np.ndarray] = {}
  for path in weight_files(model_dir):
    part = (_read_safetensors(path) if path.endswith(".safetensors")
            else _read_torch_bin(path))
    state.update(part)
  return state
