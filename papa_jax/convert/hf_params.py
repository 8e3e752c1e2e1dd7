"""Hugging Face state dicts -> Flax parameter trees, by explicit name maps.

Each family is a list of rules `(flax_path, hf_key, transform)`. Conversion
fails, listing the keys, when a rule's key is missing or when the checkpoint
holds a tensor that no rule uses and no known task head explains.
"""

from __future__ import annotations

import re
from typing import Callable, Iterable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from papa_jax.errors import ModelFileError
from papa_jax.models.config import EncoderConfig
from papa_jax.models.encoder import Encoder

Rule = tuple[tuple[str, ...], str, Callable[[np.ndarray], np.ndarray]]

BASE_PREFIX = {
    "bert": "bert.", "roberta": "roberta.", "electra": "electra.",
    "distilbert": "distilbert.", "deberta": "deberta.", "deberta-v2": "deberta.",
    "mpnet": "mpnet.", "albert": "albert.", "modernbert": "model.",
    "nomic_bert": "nomic_bert.",
}
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


def _t(w):
  return np.ascontiguousarray(w.T)


def _same(w):
  return w


def _linear(path, key, bias=True) -> list[Rule]:
  rules = [(path + ("kernel",), key + ".weight", _t)]
  if bias:
    rules.append((path + ("bias",), key + ".bias", _same))
  return rules


def _heads(path, key, h, d, bias=True) -> list[Rule]:
  """Linear [h*d, D] -> HeadProjection kernel [D, h, d], bias [h, d]."""
  rules = [(path + ("kernel",), key + ".weight",
            lambda w: _t(w).reshape(w.shape[1], h, d))]
  if bias:
    rules.append((path + ("bias",), key + ".bias", lambda b: b.reshape(h, d)))
  return rules


def _out(path, key, h, d) -> list[Rule]:
  return [
      (path + ("out_kernel",), key + ".weight",
       lambda w: _t(w).reshape(h, d, w.shape[0])),
      (path + ("out_bias",), key + ".bias", _same),
  ]


def _ln(path, key, bias=True) -> list[Rule]:
  return [(path + ("scale",), key + ".weight", _same)] + (
      [(path + ("bias",), key + ".bias", _same)] if bias else [])


def _embed(path, key) -> list[Rule]:
  return [(path + ("embedding",), key + ".weight", _same)]


def _in_proj(path, key, h, d, part) -> Rule:
  """DeBERTa v1 fused in_proj [3*h*d, D], interleaved per head as q,k,v."""
  def f(w):
    w4 = w.reshape(h, 3, d, w.shape[-1])[:, part]  # [h, d, D]
    return np.ascontiguousarray(np.transpose(w4, (2, 0, 1)))
  return (path + ("kernel",), key + ".weight", f)


def _albert_layer(p: tuple[str, ...], k: str, h: int, d: int) -> list[Rule]:
  """One ALBERT block from the shared `albert_layer_groups.G.albert_layers.J.` tensors."""
  a = p + ("attention",)
  rules = [r for n in ("query", "key", "value")
           for r in _heads(a + (n,), k + "attention." + n, h, d)]
  return (rules + _out(a, k + "attention.dense", h, d)
          + _ln(p + ("attention_norm",), k + "attention.LayerNorm")
          + _linear(p + ("intermediate",), k + "ffn") + _linear(p + ("output",), k + "ffn_output")
          + _ln(p + ("output_norm",), k + "full_layer_layer_norm"))


def _rotary_layer(c: EncoderConfig, i: int) -> list[Rule]:
  """One ModernBERT or NomicBERT layer (`convert/hf_rotary.py`), by the names on disk.

  Both fuse q, k, v into one `Wqkv` (rows q, k, v). ModernBERT's `Wi` holds the
  activated half, then the linear one; NomicBERT's original names (which HF
  writes back on save) are fc12 (activated, HF gate_proj) and fc11 (up_proj).
  """
  h, d, p, hd, im = c.num_heads, c.dim_per_head, (f"layer_{i}",), c.num_heads * c.dim_per_head, \
      c.intermediate_size
  a, b, mb = p + ("attention",), c.attention_bias, c.mlp_bias
  k = f"encoder.layers.{i}." if c.family == "nomic_bert" else f"layers.{i}."
  rules = []
  for j, name in enumerate(("query", "key", "value")):
    rules.append((a + (name, "kernel"), k + "attn.Wqkv.weight",
                  lambda w, j=j: _t(w[j * hd:(j + 1) * hd]).reshape(w.shape[1], h, d)))
    if b:
      rules.append((a + (name, "bias"), k + "attn.Wqkv.bias",
                    lambda x, j=j: x[j * hd:(j + 1) * hd].reshape(h, d)))
  out = k + ("attn.out_proj" if c.family == "nomic_bert" else "attn.Wo")
  rules.append((a + ("out_kernel",), out + ".weight", lambda w: _t(w).reshape(h, d, w.shape[0])))
  if b:
    rules.append((a + ("out_bias",), out + ".bias", _same))
  if c.family == "nomic_bert":
    rules += _linear(p + ("intermediate",), k + "mlp.fc12", bias=False)
    rules += _linear(p + ("up",), k + "mlp.fc11", bias=False)
    rules += _linear(p + ("output",), k + "mlp.fc2", bias=False)
    return rules + _ln(p + ("attention_norm",), k + "norm1") + _ln(p + ("output_norm",),
                                                                     k + "norm2")
  for j, name in enumerate(("intermediate", "up")):
    rules.append((p + (name, "kernel"), k + "mlp.Wi.weight",
                  lambda w, j=j: _t(w[j * im:(j + 1) * im])))
    if mb:
      rules.append((p + (name, "bias"), k + "mlp.Wi.bias", lambda x, j=j: x[j * im:(j + 1) * im]))
  rules += _linear(p + ("output",), k + "mlp.Wo", bias=mb)
  if i or c.first_attention_norm:
    rules += _ln(p + ("attention_norm",), k + "attn_norm", c.norm_bias)
  return rules + _ln(p + ("mlp_norm",), k + "mlp_norm", c.norm_bias)


def _rotary_rules(c: EncoderConfig) -> list[Rule]:
  e = ("embeddings",)
  rules = [r for i in range(c.num_layers) for r in _rotary_layer(c, i)]
  if c.family == "nomic_bert":
    return (_embed(e + ("word_embeddings",), "embeddings.word_embeddings")
            + _embed(e + ("token_type_embeddings",), "embeddings.token_type_embeddings")
            + _ln(e + ("LayerNorm",), "emb_ln") + rules)
  return (_embed(e + ("word_embeddings",), "embeddings.tok_embeddings")
          + _ln(e + ("LayerNorm",), "embeddings.norm", c.norm_bias) + rules
          + _ln(("final_norm",), "final_norm", c.norm_bias))


def family_rules(c: EncoderConfig,
                 layer_groups: tuple[tuple[int, int], ...] | None = None) -> list[Rule]:
  """The name rules of `c`'s family. `layer_groups` (ALBERT, from
  `hf_config.shared_layers`): each flat layer's (group, sub-layer). Shared tensors are
  copied into every layer that uses them: exact for inference and for PAPA, which treats
  each layer's heads separately; training then updates each copy on its own."""
  h, d = c.num_heads, c.dim_per_head
  if c.family in ("modernbert", "nomic_bert"):
    return _rotary_rules(c)
  e = ("embeddings",)
  rules: list[Rule] = _embed(e + ("word_embeddings",), "embeddings.word_embeddings")
  if c.position_biased_input:
    rules += _embed(e + ("position_embeddings",), "embeddings.position_embeddings")
  if c.type_vocab_size > 0:
    rules += _embed(e + ("token_type_embeddings",), "embeddings.token_type_embeddings")
  rules += _ln(e + ("LayerNorm",), "embeddings.LayerNorm")
  if c.embedding_projection != "none":
    if c.family == "albert":
      rules += _linear(e + ("embed_proj",), "encoder.embedding_hidden_mapping_in")
    elif c.family == "electra":
      rules += _linear(e + ("embed_proj",), "embeddings_project")
    else:
      rules += _linear(e + ("embed_proj",), "embeddings.embed_proj", bias=False)
  if c.relative_attention:
    rules.append((("rel_embeddings",), "encoder.rel_embeddings.weight", _same))
    if c.norm_rel_ebd:
      rules += _ln(("rel_norm",), "encoder.LayerNorm")
  if c.relative_bias_buckets:  # nn.Embedding(buckets, heads): already [buckets, H].
    rules.append((("relative_bias",), "encoder.relative_attention_bias.weight", _same))

  if c.family == "albert":
    if layer_groups is None or len(layer_groups) != c.num_layers:
      raise ModelFileError(f"ALBERT needs each of its {c.num_layers} layers' (group, sub-layer), "
                       f"got {layer_groups!r}.")
    for i, (g, j) in enumerate(layer_groups):
      k = f"encoder.albert_layer_groups.{g}.albert_layers.{j}."
      rules += _albert_layer((f"layer_{i}",), k, h, d)
    return rules
  for i in range(c.num_layers):
    p = (f"layer_{i}",)
    a = p + ("attention",)
    if c.family == "distilbert":
      k = f"transformer.layer.{i}."
      rules += _heads(a + ("query",), k + "attention.q_lin", h, d)
      rules += _heads(a + ("key",), k + "attention.k_lin", h, d)
      rules += _heads(a + ("value",), k + "attention.v_lin", h, d)
      rules += _out(a, k + "attention.out_lin", h, d)
      rules += _ln(p + ("attention_norm",), k + "sa_layer_norm")
      rules += _linear(p + ("intermediate",), k + "ffn.lin1")
      rules += _linear(p + ("output",), k + "ffn.lin2")
      rules += _ln(p + ("output_norm",), k + "output_layer_norm")
      continue
    k = f"encoder.layer.{i}."
    s = k + "attention.self."
    out, norm = k + "attention.output.dense", k + "attention.output.LayerNorm"
    if c.family == "deberta":
      rules += [_in_proj(a + (n,), s + "in_proj", h, d, j)
                for j, n in enumerate(("query", "key", "value"))]
      rules.append((a + ("query", "bias"), s + "q_bias", lambda b: b.reshape(h, d)))
      rules.append((a + ("value", "bias"), s + "v_bias", lambda b: b.reshape(h, d)))
      if c.relative_attention and "c2p" in c.pos_att_type:
        rules += _heads(a + ("pos_key",), s + "pos_proj", h, d, bias=False)
      if c.relative_attention and "p2c" in c.pos_att_type:
        rules += _heads(a + ("pos_query",), s + "pos_q_proj", h, d)
    elif c.family == "deberta-v2":
      rules += _heads(a + ("query",), s + "query_proj", h, d)
      rules += _heads(a + ("key",), s + "key_proj", h, d)
      rules += _heads(a + ("value",), s + "value_proj", h, d)
      if c.relative_attention and not c.share_att_key:
        if "c2p" in c.pos_att_type:
          rules += _heads(a + ("pos_key",), s + "pos_key_proj", h, d)
        if "p2c" in c.pos_att_type:
          rules += _heads(a + ("pos_query",), s + "pos_query_proj", h, d)
    elif c.family == "mpnet":
      s = k + "attention.attn."
      for name in ("query", "key", "value"):
        rules += _heads(a + (name,), s + name[0], h, d)
      out, norm = s + "o", k + "attention.LayerNorm"
    else:
      rules += _heads(a + ("query",), s + "query", h, d)
      rules += _heads(a + ("key",), s + "key", h, d)
      rules += _heads(a + ("value",), s + "value", h, d)
    rules += _out(a, out, h, d)
    rules += _ln(p + ("attention_norm",), norm)
    rules += _linear(p + ("intermediate",), k + "intermediate.dense")
    rules += _linear(p + ("output",), k + "output.dense")
    rules += _ln(p + ("output_norm",), k + "output.LayerNorm")
  return rules


def normalize_keys(c: EncoderConfig, keys: Iterable[str]) -> dict[str, str]:
  """Our key -> checkpoint key: strips the task model's base prefix and
  renames legacy LayerNorm gamma/beta."""
  keys = list(keys)
  prefix = BASE_PREFIX[c.family]
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
                           layer_groups: tuple[tuple[int, int], ...] | None = None) -> dict:
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
