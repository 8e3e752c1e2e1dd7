"""Hugging Face state dicts -> Flax parameter trees, by explicit name maps.

Each family (`convert/families/`) gives a list of rules `(flax_path, hf_key, transform)`.
Conversion fails, listing the keys, when a rule's key is missing or when the checkpoint
holds a tensor that no rule uses and no known task head explains.
"""

from __future__ import annotations

import re
from typing import Iterable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from papa_jax.convert import families
from papa_jax.convert.families.rules import LayerGroups, Rule
from papa_jax.errors import ModelFileError
from papa_jax.models.config import EncoderConfig
from papa_jax.models.encoder import Encoder

# Tensors of task heads and non-persistent buffers: known, deliberately unused.
IGNORED = tuple(re.compile(p) for p in (
    r"(^|\.)position_ids$", r"(^|\.)token_type_ids$", r"^pooler\.",
    r"^cls\.", r"^lm_head\.", r"^classifier\.", r"^pre_classifier\.",
    r"^qa_outputs\.", r"^discriminator_predictions\.",
    r"^generator_predictions\.", r"^generator_lm_head\.",
    r"^vocab_(transform|layer_norm|projector)\.", r"^lm_predictions\.",
    r"^mask_predictions\.", r"^sop_classifier\.", r"^predictions\.", r"^head\.",
    r"^decoder\.",
))


def family_rules(c: EncoderConfig, layer_groups: LayerGroups | None = None) -> list[Rule]:
  """The name rules of `c`'s family (`convert/families`). `layer_groups` (ALBERT, from
  `hf_config.shared_layers`): each flat layer's (group, sub-layer), whose shared tensors are
  copied into every layer that uses them."""
  return families.BY_NAME[c.family].rules(c, layer_groups)


def normalize_keys(c: EncoderConfig, keys: Iterable[str]) -> dict[str, str]:
  """Our key -> checkpoint key: strips the task model's base prefix and
  renames legacy LayerNorm gamma/beta."""
  keys = list(keys)
  base = families.BY_NAME[c.family].base_prefix
  prefix = base + "." if base else ""
  has_prefix = any(k.startswith(prefix + "embeddings.") for k in keys)
  out = {}
  for orig in keys:
    key = orig[len(prefix):] if has_prefix and orig.startswith(prefix) else orig
    key = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", key)
    key = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", key)
    if key in out:  # Which of the two a reader takes is not defined: refuse both.
      raise ModelFileError(f"Checkpoint tensors {out[key]} and {orig} are both {key}.")
    out[key] = orig
  return out


def _weights(state: Mapping[str, np.ndarray], name: str, source: str) -> np.ndarray:
  """A checkpoint tensor that can be weights: floating point (not integers, which a cast
  would turn into other numbers: quantized weights need their scales), every value finite."""
  value = np.asarray(state[name])
  if value.dtype.kind in "biu":
    raise ModelFileError(f"{source}: tensor {name} is {value.dtype}, not floating point "
                     "(a quantized checkpoint? dequantize it first).")
  finite = np.isfinite(value.astype(np.float32, copy=False))
  if not finite.all():
    at = np.unravel_index(int(np.argmin(finite)), value.shape)
    raise ModelFileError(f"{source}: tensor {name} {value.shape} holds {(~finite).sum()} "
                     f"non-finite values (first at {tuple(int(i) for i in at)}: "
                     f"{value[at]}).")
  return value


def _set(tree: dict, path: Iterable[str], value) -> None:
  *parents, leaf = path
  for p in parents:
    tree = tree.setdefault(p, {})
  if leaf in tree:
    raise ValueError(f"Two rules write {'/'.join(path)}.")  # internal check
  tree[leaf] = value


def expected_shapes(c: EncoderConfig) -> dict:
  shapes = jax.eval_shape(
      lambda: Encoder(c).init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32)))
  return shapes["params"]


def params_from_state_dict(c: EncoderConfig, state: Mapping[str, np.ndarray], *,
                           source: str = "checkpoint", to_device: bool = True,
                           layer_groups: LayerGroups | None = None) -> dict:
  """Converts a HF state dict to this project's parameter tree (float32).

  Tensors are read one at a time (lazily, from a `LazyStateDict`) and put on
  the device as soon as converted, so memory peaks near one copy of the model.

  Raises:
    ValueError: listing missing keys, unexpected keys, or shape mismatches
      between the checkpoint and the architecture in its config.
  """
  try:
    names = normalize_keys(c, state.keys())
  except ValueError as e:
    raise ModelFileError(f"{source}: {e}") from None
  rules = family_rules(c, layer_groups)
  missing = sorted({key for _, key, _ in rules if key not in names})
  used = {key for _, key, _ in rules}
  unexpected = sorted(
      k for k in names if k not in used and not any(p.search(k) for p in IGNORED))
  if missing or unexpected:
    raise ModelFileError(
        f"{source} does not match a {c.family} encoder with "
        f"{c.num_layers} layers: missing keys {missing[:20]}"
        f"{' ...' if len(missing) > 20 else ''}; unexpected keys "
        f"{unexpected[:20]}{' ...' if len(unexpected) > 20 else ''}."
    )
  want = {tuple(getattr(k, "key", k) for k in path): v.shape
          for path, v in jax.tree_util.tree_leaves_with_path(expected_shapes(c))}
  params: dict = {}
  cache: dict[str, np.ndarray] = {}
  bad = []
  for path, key, fn in rules:
    if key not in cache:
      cache = {key: _weights(state, names[key], source)}  # Keep only the tensor in use.
    try:
      value = np.asarray(fn(cache[key]), dtype=np.float32)
      got = value.shape
    except (ValueError, IndexError):  # A reshape that the tensor's shape does not allow.
      value, got = None, "no reshape"
    if got != want.get(path):
      bad.append(f"{'/'.join(path)} <- {names[key]} {cache[key].shape}: "
                 f"checkpoint {got} vs config {want.get(path)}")
    elif not bad:
      _set(params, path, jnp.asarray(value) if to_device else value)
  if bad:
    raise ModelFileError(f"{source} tensor shapes do not match its config: "
                     + "; ".join(bad[:10]) + (" ..." if len(bad) > 10 else ""))
  got = {path for path, _, _ in rules}
  if set(want) != got:
    # internal check
    raise ValueError(f"Converted tree differs from the model: missing "
                     f"{sorted(set(want) - got)}, extra {sorted(got - set(want))}.")
  return params
