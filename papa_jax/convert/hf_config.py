"""Hugging Face `config.json` -> `EncoderConfig`, by the family of its `model_type`.

Each family's reading lives in its module under `convert/families/`; this module reads the
file, checks what no family supports (decoders) and words a missing or bad field for the user.
Attributes that change the architecture in ways this project does not implement are an
error; metadata is ignored.
"""

from __future__ import annotations

import os
from typing import Any

from papa_jax.convert import families
from papa_jax.convert.checkpoint_io import read_json_object
from papa_jax.convert.families.albert import albert_layer_groups  # noqa: F401 (re-exported)
from papa_jax.convert.families.family import activation, unsupported
from papa_jax.errors import ModelFileError, ModelNotFound
from papa_jax.models.config import EncoderConfig

# model_type -> family name, from the registry (`convert/families`). XLM-R and CamemBERT
# share RoBERTa's architecture.
MODEL_TYPES = {t: f.name for t, f in families.BY_MODEL_TYPE.items()}


def read_config_json(model_dir: str) -> dict[str, Any]:
  path = os.path.join(model_dir, "config.json")
  if not os.path.isdir(model_dir):
    raise ModelNotFound(f"Model directory {model_dir!r} does not exist.")
  if not os.path.isfile(path):
    raise ModelNotFound(
        f"{model_dir!r} has no config.json; a Hugging Face model directory "
        "needs config.json plus model.safetensors or pytorch_model.bin."
    )
  return read_json_object(path)


def encoder_config_from_hf(cfg: dict[str, Any], name: str = "") -> EncoderConfig:
  """Maps a Hugging Face config dict to an `EncoderConfig`, resolving family quirks;
  ValueError naming the field when one is missing or out of range."""
  try:
    return _encoder_config(cfg, name)
  except KeyError as e:
    raise ModelFileError(f"config.json{_of(name)} lacks the field {e.args[0]!r}, which a "
                     f"{cfg.get('model_type')} config needs.") from None
  except ValueError as e:
    raise ModelFileError(f"config.json{_of(name)}: {e}") from None


def _of(name: str) -> str:
  return f" of {name}" if name else ""


def _encoder_config(cfg: dict[str, Any], name: str) -> EncoderConfig:
  model_type = cfg.get("model_type")
  if model_type not in families.BY_MODEL_TYPE:
    raise ModelFileError(
        f"Unsupported model_type {model_type!r}; supported: {sorted(MODEL_TYPES)}."
    )
  act = activation(cfg)
  if not isinstance(act, str):
    raise ModelFileError(f"Unsupported non-string activation {act!r}.")
  for key in ("is_decoder", "add_cross_attention"):
    unsupported(cfg, key, False, "decoder configuration")
  return families.BY_MODEL_TYPE[model_type].config(cfg, name)


def shared_layers(cfg: dict[str, Any]) -> tuple[tuple[int, int], ...] | None:
  """Each flat layer's (group, sub-layer) when layers share parameters (ALBERT), else None."""
  family = families.BY_MODEL_TYPE.get(cfg.get("model_type"))
  return family.shared_layers(cfg) if family and family.shared_layers else None
