"""Hugging Face PyTorch models as the oracle: small random ones, saved to disk.

Each spec builds a randomly initialised HF model with `transformers` itself,
so the reference numerics are Hugging Face's own code. The families and their HF classes come
from the converter's registry (`papa_jax/convert/families`); their random configs are here.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from papa_jax.convert.families import FAMILIES, CodePath, Family

COMMON = dict(vocab_size=120, hidden_size=64, num_hidden_layers=3,
              num_attention_heads=4, intermediate_size=96,
              max_position_embeddings=128)
MODERNBERT_IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1,
                      sep_token_id=2)


# Each registered family's random architectures (`papa_jax.convert.families.FAMILIES`), under the
# family's name: architecture -> its random Hugging Face config, from the `transformers`
# module; the model class is the family's `oracle_class`. One architecture is named after its
# family (the one family-level tests run); the others are variants that parity and conversion
# also run. tests/convert/families_test.py fails when a registered family has no entry here.
RANDOM_CONFIGS = {
    "bert": {"bert": lambda tr: tr.BertConfig(**COMMON)},
    "roberta": {"roberta": lambda tr: tr.RobertaConfig(
        **{**COMMON, "max_position_embeddings": 130}, type_vocab_size=1, pad_token_id=1,
        bos_token_id=0, eos_token_id=2)},
    "electra": {"electra": lambda tr: tr.ElectraConfig(**COMMON, embedding_size=32)},
    "distilbert": {"distilbert": lambda tr: tr.DistilBertConfig(
        vocab_size=120, dim=64, n_layers=3, n_heads=4, hidden_dim=96,
        max_position_embeddings=128)},
    "deberta": {
        # Like microsoft/deberta-base.
        "deberta": lambda tr: tr.DebertaConfig(
            **COMMON, type_vocab_size=0, relative_attention=True, max_relative_positions=-1,
            pos_att_type="c2p|p2c", position_biased_input=False, layer_norm_eps=1e-7),
        # v1 with absolute positions, segments and a short span.
        "deberta-abs": lambda tr: tr.DebertaConfig(
            **COMMON, type_vocab_size=2, relative_attention=True, max_relative_positions=16,
            pos_att_type=["c2p"], position_biased_input=True),
    },
    "deberta-v2": {
        # Like microsoft/deberta-v3: buckets, shared keys.
        "deberta-v3": lambda tr: tr.DebertaV2Config(
            **COMMON, type_vocab_size=0, relative_attention=True, position_buckets=16,
            max_relative_positions=-1, pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm",
            share_att_key=True, position_biased_input=False, layer_norm_eps=1e-7),
        # v2-xlarge style: own position projections, embed_proj.
        "deberta-v2": lambda tr: tr.DebertaV2Config(
            **COMMON, type_vocab_size=0, embedding_size=48, relative_attention=True,
            position_buckets=-1, max_relative_positions=32, pos_att_type="c2p|p2c",
            share_att_key=False, position_biased_input=True),
    },
    # Like all-mpnet-base-v2: positions from pad 1, 32 relative buckets.
    "mpnet": {"mpnet": lambda tr: tr.MPNetConfig(
        **{**COMMON, "max_position_embeddings": 130}, pad_token_id=1,
        relative_attention_num_buckets=32, layer_norm_eps=1e-5)},
    "albert": {
        # Like albert-base-v2: one shared group, factorised embeddings.
        "albert": lambda tr: tr.AlbertConfig(**COMMON, embedding_size=32, hidden_act="gelu_new"),
        # 3 layers over 2 groups (0, 0, 1), 2 blocks per layer.
        "albert-groups": lambda tr: tr.AlbertConfig(
            **{**COMMON, "num_hidden_layers": 3}, embedding_size=48, num_hidden_groups=2,
            inner_group_num=2),
    },
    "modernbert": {
        # Local layers 1, 3 see |i - j| <= 4 (of 40 tokens).
        "modernbert": lambda tr: tr.ModernBertConfig(
            **{**COMMON, "global_attn_every_n_layers": 2, "local_attention": 8,
               "num_hidden_layers": 4}, **MODERNBERT_IDS),
        # Every bias on, three layers: layer 1 and 2 local.
        "modernbert-bias": lambda tr: tr.ModernBertConfig(
            **{**COMMON, "global_attn_every_n_layers": 3, "local_attention": 6,
               "attention_bias": True, "mlp_bias": True, "norm_bias": True,
               "num_hidden_layers": 3}, **MODERNBERT_IDS),
    },
    "nomic_bert": {"nomic_bert": lambda tr: tr.NomicBertConfig(**COMMON)},
}


def _archs() -> dict[str, tuple[Family, Callable]]:
  """Every random architecture of the registered families, in the registry's order:
  name -> (family, config builder)."""
  return {arch: (f, build) for f in FAMILIES for arch, build in RANDOM_CONFIGS.get(f.name,
                                                                                    {}).items()}


def spec(name: str):
  """(config, model class) for a named random test architecture."""
  import transformers as tr
  family, build = _archs()[name]
  return build(tr), getattr(tr, family.oracle_class)


def _first_of_each(key) -> tuple[str, ...]:
  """The first family (by its own architecture) of each value of `key(family.code_path)`."""
  seen: dict = {}
  for f in FAMILIES:
    seen.setdefault(key(f.code_path), f.name)
  return tuple(seen.values())


ARCHS = tuple(_archs())
# Families by what the attention and layer code branch on (models/encoder.py; the registry's
# `code_path`), for tests of invariants that hold by construction (the family-dependent ones:
# parity, conversion, decomposition, windowing, run on every ARCH). tests/convert/parity_test.py
# holds both tuples equal to the rule (`code_path`, the first ARCH of each value).
# One family per attention code path: score kind, relative bias, local windows, rotary
# positions, LayerNorm placement.
ONE_PER_PATH = _first_of_each(lambda path: path)
# One family per layer layout: post-LN (absolute positions) and pre-LN (rotary, windows).
LAYOUTS = _first_of_each(lambda path: path.norm_placement)
# The families with post-LayerNorm layers (the context-mixing decomposition's), sorted.
POST_LN = tuple(sorted(f.name for f in FAMILIES if f.code_path.norm_placement == "post"))


def by_path(arch: str, *values):
  """A parameter `(arch, *values)` of a family matrix: in the unit tier for the family that
  stands for its code path (ONE_PER_PATH), in integration for the others."""
  import pytest
  tier = pytest.mark.unit if arch in ONE_PER_PATH else pytest.mark.integration
  return pytest.param(arch, *values, marks=tier)


def code_path(name: str) -> CodePath:
  """What the encoder's attention and layer code branch on, for random architecture `name`."""
  from papa_jax.convert import hf_config
  return CodePath.of(hf_config.encoder_config_from_hf(spec(name)[0].to_dict()))


# HF initialises these LayerNorms to (1, 0) and biases to 0: perturbed so each one counts.
PERTURBED = ("modernbert", "modernbert-bias", "nomic_bert")


def save_random(name: str, path, safe: bool = True, seed: int = 0) -> None:
  import torch
  config, cls = spec(name)
  config._attn_implementation = "eager"
  torch.manual_seed(seed)
  model = cls(config).eval()
  if name == "mpnet":  # HF's init (std 0.02) leaves the relative bias nearly invisible.
    with torch.no_grad():
      model.encoder.relative_attention_bias.weight.normal_(0.0, 1.0)
  if name in PERTURBED:
    with torch.no_grad():
      for key, p in model.named_parameters():
        if "norm" in key.lower() or key.endswith("bias"):
          p.add_(torch.randn_like(p) * 0.2)
  model.save_pretrained(str(path))
  if not safe:  # transformers 5 only writes safetensors; write the legacy pickle.
    (path / "model.safetensors").unlink()
    torch.save(model.state_dict(), path / "pytorch_model.bin")


def converted_random(name: str, path):
  """`save_random(name, path)` converted to this project's model (skips without torch);
  for families without a shared fixture."""
  import pytest
  pytest.importorskip("torch")
  import papa_jax as pj
  save_random(name, path)
  return pj.load_pretrained(str(path))


def load_hf(path, dtype="float32"):
  import torch
  import transformers as tr
  model = tr.AutoModel.from_pretrained(str(path), attn_implementation="eager").eval()
  return model.to(getattr(torch, dtype))


def run_hf(model, ids, mask, token_type_ids=None):
  """Hidden states (embeddings first) and attentions as numpy lists."""
  import torch
  kwargs = dict(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                output_attentions=True, output_hidden_states=True)
  if token_type_ids is not None:
    kwargs["token_type_ids"] = torch.tensor(token_type_ids)
  with torch.no_grad():
    out = model(**kwargs)
  return ([h.numpy() for h in out.hidden_states], [a.numpy() for a in out.attentions])


def padded_batch(vocab: int, lengths, seq_len: int, pad_id: int, seed: int = 0):
  """Random ids with mixed lengths, padded with `pad_id` on the right."""
  rng = np.random.default_rng(seed)
  low = 3 if pad_id < 3 else 0
  ids = rng.integers(low, vocab, size=(len(lengths), seq_len))
  ids[ids == pad_id] = low + (pad_id + 1) % (vocab - low)
  mask = (np.arange(seq_len)[None] < np.asarray(lengths)[:, None]).astype(np.int64)
  ids = np.where(mask == 1, ids, pad_id)
  return ids.astype(np.int64), mask


FAMILY_LENGTHS, FAMILY_LEN = (40, 7, 1, 25), 40


def family_batch(config, seed: int = 0):
  """The family tests' one batch shape (so their op-by-op compiles are shared): lengths 40
  (no padding), 7 and 1 (under any head size here) and 25, padded to 40."""
  return padded_batch(config.vocab_size, FAMILY_LENGTHS, FAMILY_LEN, config.pad_token_id, seed)


def max_diffs(ours, ref_hidden, ref_attn, mask, real_only=True):
  """Our `EncoderOutput` against HF's hidden states and attentions: (max |dh| / max |h| over
  layers, max |dh|, max |dA|), at real tokens (and real query rows) or everywhere."""
  m = mask.astype(bool) if real_only else np.ones(mask.shape, bool)
  rel = ab = att = 0.0
  for a, b in zip(ours.hidden_states, ref_hidden, strict=True):
    d = np.abs(np.asarray(a, np.float64) - b)[m]
    rel, ab = max(rel, d.max() / np.abs(b[m]).max()), max(ab, d.max())
  for a, b in zip(ours.attentions, ref_attn, strict=True):
    d = np.abs(np.asarray(a, np.float64) - b)
    att = max(att, d[np.broadcast_to(m[:, None, :, None], d.shape)].max())
  return rel, ab, att


def ours_f64(model, *args, **kwargs):
  """`model` (a `Pretrained`) run in float64, attentions captured, as numpy."""
  import jax
  import jax.numpy as jnp
  with jax.enable_x64(True):
    p64 = jax.tree.map(lambda x: jnp.asarray(x, jnp.float64), model.params)
    out = model.module.apply({"params": p64}, *args, capture_attention=True, **kwargs)
    return jax.tree.map(np.asarray, out)


def run_hf_editing_probs(model, ids, mask, edit, layers: int) -> np.ndarray:
  """HF's last hidden state with each layer's attention probabilities replaced by
  `edit(layer, probs)` (torch `[B, H, L, L]` -> same).

  Every family's eager attention computes its probabilities with one softmax over the keys per
  layer, in layer order (ALBERT's shared layer too); a torch function mode counts those calls,
  so the hook needs no per-family module names and sees exactly what the softmax gave.
  `layers`: how many attention layers run (ALBERT's groups run several per HF layer)."""
  import torch
  from torch.overrides import TorchFunctionMode
  calls = []

  class Edit(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
      out = func(*args, **(kwargs or {}))
      if getattr(func, "__name__", "") == "softmax" and out.ndim == 4:
        calls.append(out.shape)
        out = edit(len(calls) - 1, out)  # The mode is off inside its own handler.
      return out

  with Edit(), torch.no_grad():
    out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
  assert len(calls) == layers, (len(calls), layers)  # One softmax per attention layer.
  return out.last_hidden_state.numpy()


def local_windows(hf_config, seq_len: int, layers: int) -> list[np.ndarray | None]:
  """Per attention layer, ModernBERT's local window (`[L, L]` bool: |i - j| <=
  local_attention // 2) on its local layers, else None; every other family has none."""
  every = getattr(hf_config, "global_attn_every_n_layers", None)
  if every is None:
    return [None] * layers
  i = np.arange(seq_len)
  band = np.abs(i[:, None] - i[None, :]) <= hf_config.local_attention // 2
  return [None if l % every == 0 else band for l in range(layers)]
