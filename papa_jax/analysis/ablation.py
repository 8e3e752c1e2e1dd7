"""Head ablation (Sun & Marasovic's fig. 8), tied to PAPA's head ranking.

A probe is trained on the unmodified frozen encoder (the PAPA recipe, cached
float32 features). Then, for every layer and head, that head's attention is
replaced, on every dev example, by
  * "uniform": uniform attention over the example's real tokens (theirs);
  * "constant": its dataset-mean constant matrix (PAPA's);
  * "effective": its effective attention (which leaves the layer's output
    unchanged by construction, A_eff V = A V: a check, not an intervention),
and the same probe re-scores the task. The ablations differ only in the
override, which is data (`AttentionOverride.ablate`): the dev set is expanded
to (example, head) rows, batched over the mesh, and the encoder starts at the
ablated layer from the cached hidden states, so layers before it are never
recomputed. One compiled program per (replacement, layer).
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from papa_jax import parallel
from papa_jax.attention import AttentionOverride
from papa_jax.models.config import EncoderConfig
from papa_jax.models.encoder import Encoder

KINDS = ("uniform", "constant", "effective")


def rows(data, num_heads: int, examples: np.ndarray) -> dict[str, np.ndarray]:
  """The (example, head) rows of one layer's ablations: example-major, R = N x H."""
  ex = np.repeat(examples, num_heads).astype(np.int32)
  head = np.tile(np.arange(num_heads, dtype=np.int32), len(examples))
  return dict(example=ex, head=head, input_ids=data.input_ids[ex],
              attention_mask=data.attention_mask[ex], token_type_ids=data.token_type_ids[ex])


def make_ablated_logits(config: EncoderConfig, probe: nn.Module, kind: str, layer: int):
  """`(frozen, batch) -> probe logits` with one head of `layer` replaced per row.

  `frozen` is `(encoder params, probe params, hidden [N, K, L, D] float32 of
  the unmodified encoder, constants [layers, H, L, L] or None)`.
  """
  if kind not in KINDS:
    raise ValueError(f"ablation kind {kind!r}; choose one of {KINDS}.")
  module = Encoder(config)

  def fn(frozen, batch):
    enc, probe_params, hidden, constants = frozen
    mask = batch["attention_mask"]
    ov = AttentionOverride.ablate(kind, jnp.full_like(batch["head"], layer), batch["head"],
                                  constants if kind == "constant" else None)
    before = hidden[batch["example"]]  # [R, K, L, D]
    out = module.apply({"params": enc}, batch["input_ids"], mask, batch["token_type_ids"],
                       override=ov, start_layer=layer, start_hidden=before[:, layer])
    feats = jnp.concatenate([before[:, :layer], jnp.stack(out.hidden_states, 1)], axis=1)
    return probe.apply({"params": probe_params}, feats, mask, deterministic=True)

  return fn


@functools.lru_cache(maxsize=32)
def compiled(config: EncoderConfig, probe: nn.Module, kind: str, layer: int, mesh):
  repl, shard = parallel.replicated(mesh), parallel.batch_sharding(mesh)
  return jax.jit(make_ablated_logits(config, probe, kind, layer), in_shardings=(repl, shard),
                 out_shardings=repl)


def ablate_layer(config: EncoderConfig, probe: nn.Module, kind: str, layer: int, frozen,
                 data, mesh, batch_size: int, desc: str = "") -> np.ndarray:
  """Probe outputs `[H, N, ...]`: row h holds every example with head h ablated."""
  fn = compiled(config, probe, kind, layer, mesh)
  n, h = len(data), config.num_heads
  table = rows(data, h, np.arange(n))
  outs = [out[valid] for _, out, valid in parallel.map_batches(
      lambda b: fn(frozen, b), table, batch_size=batch_size, mesh=mesh, desc=desc)]
  logits = np.concatenate(outs)
  return logits.reshape((n, h) + logits.shape[1:]).swapaxes(0, 1)


def rank_agreement(drop: np.ndarray, gates: np.ndarray, fraction: float = 0.5) -> dict:
  """Ablation importance (score drop) vs PAPA's gates (high = input-dependent).

  Spearman correlation of the two per-head orders, and the overlap of the
  heads each calls least important (the `fraction` PAPA makes constant first).
  """
  import scipy.stats  # pylint: disable=import-outside-toplevel
  d, g = np.asarray(drop, np.float64).ravel(), np.asarray(gates, np.float64).ravel()
  k = int(np.floor(fraction * len(d)))
  least_ablation = set(np.argsort(d, kind="stable")[:k].tolist())
  least_papa = set(np.argsort(g, kind="stable")[:k].tolist())
  res = scipy.stats.spearmanr(d, g)
  return dict(spearman=float(res.statistic), p_value=float(res.pvalue), heads=len(d),
              least_important=k, overlap=len(least_ablation & least_papa),
              overlap_expected_by_chance=k * k / len(d))
