"""The library from a notebook: constant matrices, overrides, effective attention, results.

  import papa_jax as pj
  m = pj.load_pretrained("sentence-transformers/all-MiniLM-L6-v2")
  data = pj.encode_texts(m, ["a first sentence .", "and a second one ."], max_length=32)
  means = pj.attention_means(m, data)                      # [layers, heads, L, L]
  out = m.apply(data.input_ids, data.attention_mask,
                override=pj.AttentionOverride.constant(means.avgs))
  eff = pj.effective_attentions(m.apply(data.input_ids, data.attention_mask,
                                        capture=pj.Capture(probs=True, values=True)),
                                data.attention_mask)
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from papa_jax import parallel, reader
from papa_jax.measures import attention_flow, mixing, mixing_methods
from papa_jax.convert import Pretrained
from papa_jax.data import preprocess, tasks
from papa_jax.measures.effective import effective_attention
from papa_jax.models.encoder import Encoder
from papa_jax.papa import means as means_lib


def encode_texts(model: Pretrained, texts: Sequence[str], pairs: Sequence[str] | None = None, *,
                 max_length: int = 64, papa_layout: bool = True) -> preprocess.Encoded:
  """Tokenizes sentences (or sentence pairs) to fixed-length arrays.

  With `papa_layout` (PAPA's positional layout), [CLS] and the first segment
  fill the first half, the separator sits at L/2 and the final one at L-1.
  """
  task = tasks.get_task("mrpc" if pairs is not None else "sst2")
  records = [dict(idx=i, text_a=a, text_b=pairs[i] if pairs is not None else "", label=0)
             for i, a in enumerate(texts)]
  return preprocess.encode(task, records, model.tokenizer(), max_length, papa_layout=papa_layout,
                           type_vocab_size=model.config.type_vocab_size)


def attention_means(model: Pretrained, data: preprocess.Encoded | Sequence[str], *,
                    max_length: int = 64, batch_size: int = 32, attention: str = "raw",
                    mesh=None) -> means_lib.Means:
  """PAPA's constant matrices: attention averaged over real token pairs of `data`.

  Args:
    model: a loaded encoder.
    data: an `Encoded` split, or texts (encoded with the PAPA layout).
    max_length: length for texts.
    batch_size: global batch (rounded up to a multiple of the mesh size;
      padding rows do not count).
    attention: "raw", or "effective" for mean effective attention.
    mesh: the data mesh (default: every device).

  Returns:
    `Means` with `avgs [layers, heads, L, L]`, `sums`, `counts [L, L]`.
  """
  if not isinstance(data, preprocess.Encoded):
    data = encode_texts(model, list(data), max_length=max_length)
  mesh = mesh or parallel.make_mesh()
  batch_size = -(-batch_size // mesh.size) * mesh.size
  state = means_lib.accumulate(model.config, model.params, data, mesh, batch_size=batch_size,
                               attention=attention)
  return means_lib.Means(state.averages(), state.sums, state.counts,
                         dict(num_examples=state.num_examples, attention=attention))


def effective_attentions(output, attention_mask) -> tuple:
  """Every layer's effective attention `[B, H, L, L]` from an `EncoderOutput`.

  `output` must come from `apply(..., capture=Capture(probs=True, values=True))`;
  pad keys and pad queries get zeros (mask-aware).
  """
  if output.attentions is None or output.values is None:
    # caller's argument
    raise ValueError("Run the model with capture=Capture(probs=True, values=True).")
  out = []
  for a, v in zip(output.attentions, output.values):
    key_mask = np.broadcast_to(np.asarray(attention_mask)[:, None, :] > 0, a.shape[:-1])
    out.append(effective_attention(a, v, key_mask)[0])
  return tuple(out)


def load_results(path: str) -> dict:
  """A finished workdir's results: rows and summary, and the arrays behind them.

  Returns a dict with `config`, `rows`, `summary` (from results.json when the
  probe stage ran), `means` (variant -> `Means`), `lambdas` and `ranking`
  (when the sort stage ran), and each analysis stage's stats under its name
  (`effective`, `finetune`, `linguistic`, `ablation`). `reader.read_workdir`
  gives the same as an object.
  """
  wd = reader.read_workdir(path)
  out: dict = {"config": wd.config, "means": wd.means}
  if wd.results is not None:
    out.update(rows=wd.results["rows"], summary=wd.results["summary"])
  if wd.ranking is not None:
    out.update(lambdas=wd.lambdas, ranking=wd.ranking)
  out.update(wd.stats)
  return out


MIXING = mixing_methods.NAMES  # The registry, papa_jax/measures/mixing_methods.py.
FLOW = "attention_flow"  # CPU max-flow per example (papa_jax/measures/attention_flow.py): opt-in.


def context_mixing(model: Pretrained, data: preprocess.Encoded, methods: Sequence[str] = MIXING,
                   *, batch_size: int = 8, rollout: bool = True,
                   allow_low_precision: bool = False) -> dict[str, np.ndarray]:
  """Per-example context-mixing maps of every layer (`papa_jax/measures/mixing.py`).

  Args:
    model: a loaded post-LayerNorm encoder (float32).
    data: encoded examples (`encode_texts`).
    methods: any of `MIXING` (the registry, `mixing_methods.METHODS`): "attention"
      (head-mean attention, rows renormalised), "head_norms" (`[B, layers, H, N, N]`), the
      summed norms "attn", "attnres", "attnresln", "globenc" (N-Enc), "alti",
      "value_zeroing" (row-normalised); and `FLOW`, "attention_flow" (the last layer's
      flow, `[B, N, N]`; n^2 max-flow solves per example on the CPU: slow above ~64
      tokens, and it warns).
    batch_size: examples per forward.
    rollout: also `<method>_rollout` for the methods rolled out (`MixingMethod.rollout`):
      attention (residual 0.5), alti, value_zeroing and globenc (no residual,
      unnormalised products).
    allow_low_precision: accept a bfloat16 model (the decompositions then hold to ~1e-2).

  Returns:
    `{method: [B, layers, N, N] float32}`; pad rows and columns are 0. Everything runs
    under the highest matmul precision.
  """
  bad = sorted(set(methods) - set(MIXING) - {FLOW})
  if bad:
    # caller's argument
    raise ValueError(f"Unknown context-mixing methods {bad}; choose from {MIXING + (FLOW,)}.")
  if model.config.compute_dtype != "float32" and not allow_low_precision:
    raise ValueError(f"context mixing decomposes each layer exactly: load the model in float32 "
                     f"(its compute dtype is {model.config.compute_dtype}), or pass "
                     f"allow_low_precision=True.")  # caller's argument
  mixing.check_decomposable(model.config)
  jitted = tuple(dict.fromkeys(m for m in (*methods, *(("attention",) if FLOW in methods
                                                      else ())) if m != FLOW))
  fn = _mixing_fn(model.config, jitted, rollout)
  with jax.default_matmul_precision("highest"):
    parts = [fn(model.params, {k: v[i:i + batch_size] for k, v in data.arrays().items()})
             for i in range(0, len(data), batch_size)]
  out = {k: np.concatenate([np.asarray(p[k]) for p in parts]) for k in parts[0]}
  if FLOW in methods:
    out[FLOW] = np.stack([attention_flow.example_flow(a, m) for a, m in zip(
        out["attention"], data.arrays()["attention_mask"])]).astype(np.float32)
    if "attention" not in methods:
      out.pop("attention")
      out.pop("attention_rollout", None)
  return out


@functools.lru_cache(maxsize=8)
def _mixing_fn(config, methods: tuple[str, ...], rollout: bool):
  module = Encoder(config)
  options = mixing_methods.Options()  # The `mixing` group's defaults.

  def fn(params, batch):
    out = module.apply({"params": params}, batch["input_ids"], batch["attention_mask"],
                       batch["token_type_ids"], capture=mixing.CAPTURE)
    m = batch["attention_mask"].astype(jnp.float32)
    maps: dict[str, list] = {}
    for l, layer in enumerate(out.layers):
      t = mixing.layer_terms(layer, out.hidden_states[l], m, params[f"layer_{l}"])
      for name in methods:
        maps.setdefault(name, []).append(mixing_methods.METHODS[name].layer(t, config, options))
    for name in tuple(maps) if rollout else ():
      method = mixing_methods.METHODS[name]
      if method.rollout:
        maps[name + mixing_methods.ROLLOUT] = mixing.rollout(maps[name], m,
                                                             residual=method.residual)
    return {k: jnp.stack(v, 1) for k, v in maps.items()}

  return jax.jit(fn)
