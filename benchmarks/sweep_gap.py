"""Where a head-ablation sweep's time goes: papa-jax's patched rows per layer against Hugging
Face's forward at the same shape, in one process.

  python benchmarks/sweep_gap.py [--n 256 --chunk 6 --rounds 3]

`benchmarks/sweep_bench.py`'s data and metric (the first `n` SST-2 dev sentences padded to the
longest, a seeded MLM head's logit difference at [CLS]) at its chunk shape: `chunk` targets x
`n` sentences as rows (1,536 by default). Timed round-robin (`common.interleaved`):
  papa_jax_from0 / papa_jax_from5: `patching._patched` (one head's context zeroed per target)
      run from layer 0 (every layer) and from the last layer (one), from the cached inputs;
  papa_jax_plain: the jitted unpatched forward and metric (every layer);
  hf_sdpa / hf_eager: `BertModel` (MiniLM's weights) over the same rows, SDPA and eager
      attention (every layer, no head).
From these: seconds per layer on each side, and the sweep's best ratio against HF batched
that layer skipping allows (HF reruns every layer per target, papa-jax (layers + 1) / 2 of
them on average), at equal cost per layer.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common, patching_bench, sweep_bench  # pylint: disable=wrong-import-position


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--n", type=int, default=256)
  ap.add_argument("--chunk", type=int, default=6)
  ap.add_argument("--rounds", type=int, default=3)
  args = ap.parse_args()
  common.tune_cpu()
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  import papa_jax as pj  # pylint: disable=import-outside-toplevel
  from papa_jax.causal import metrics, patching  # pylint: disable=import-outside-toplevel
  common.set_torch_threads()
  n, chunk = args.n, args.chunk
  ids, mask, _, _, tokens = sweep_bench.data(n)
  m = pj.load_pretrained(sweep_bench.MINILM)
  c = m.config
  metric = metrics.as_metric(patching_bench.mlm_metric(tokens, c.layer_norm_eps))
  arrays = dict(input_ids=jnp.asarray(ids, jnp.int32),
                attention_mask=jnp.asarray(mask, jnp.int32))
  tiled = {k: jnp.tile(v, (chunk, 1)) for k, v in arrays.items()}
  example = jnp.asarray(np.tile(np.arange(n, dtype=np.int32), chunk))
  zeros = jnp.zeros((c.num_layers, n, ids.shape[1], c.num_heads, c.dim_per_head))
  hidden = patching._hidden(m.module, m.params, arrays,  # pylint: disable=protected-access
                            layer=c.num_layers - 1)
  pos = jnp.full(chunk * n, -1, jnp.int32)
  heads = jnp.asarray(np.repeat(np.arange(chunk) % c.num_heads, n), jnp.int32)

  def ours(layer):
    return lambda: jax.block_until_ready(patching._patched(  # pylint: disable=protected-access
        m.module, m.params, hidden, zeros, metric, tiled, example, pos, heads,
        site="context", layer=layer))
  plain = jax.jit(lambda p, b: metric(m.module.apply({"params": p}, b["input_ids"],
                                                     b["attention_mask"]), b))
  bert = patching_bench.mlm_head().bert
  ids_t = torch.tensor(np.tile(ids, (chunk, 1)))
  mask_t = torch.tensor(np.tile(mask, (chunk, 1)))

  def hf(impl):
    def run():
      bert.config._attn_implementation = impl  # pylint: disable=protected-access
      with torch.no_grad():
        bert(ids_t, attention_mask=mask_t)
    return run
  last = c.num_layers - 1
  med, _ = common.interleaved({
      "papa_jax_from0": ours(0), f"papa_jax_from{last}": ours(last),
      "papa_jax_plain": lambda: jax.block_until_ready(plain(m.params, tiled)),
      "hf_sdpa": hf("sdpa"), "hf_eager": hf("eager")}, rounds=args.rounds, warmup=1)
  ours_layer = (med["papa_jax_from0"] - med[f"papa_jax_from{last}"]) / last
  rows = [dict(impl=k, seconds=v, layers=c.num_layers if k != f"papa_jax_from{last}" else 1)
          for k, v in med.items()]
  common.report(f"Sweep rows per layer, MiniLM, {chunk} x {n} rows x {ids.shape[1]} tokens",
                rows)
  hf_layer = med["hf_sdpa"] / c.num_layers
  mean_layers = (c.num_layers + 1) / 2
  print(f"\npapa-jax per layer (from0 - from{last}) / {last}: {ours_layer:.3g} s; "
        f"HF SDPA per layer (with its embeddings): {hf_layer:.3g} s; "
        f"ratio {ours_layer / hf_layer:.3g}."
        f"\nBest sweep ratio against HF batched from layer skipping: {c.num_layers} / "
        f"{mean_layers:g} x {hf_layer / ours_layer:.3g} = "
        f"{c.num_layers / mean_layers * hf_layer / ours_layer:.3g}x")


if __name__ == "__main__":
  main()
