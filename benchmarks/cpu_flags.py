"""XLA-CPU settings compared on this machine: which is fastest, and does it change numbers?

  python benchmarks/cpu_flags.py [--repeats 7]

Each setting runs in its own process (XLA reads XLA_FLAGS once): MiniLM
forward (b32 L128, hidden states), the means pass's forward (b32 L64, every
attention map captured), a MiniLM-shaped GEMM [4096,384]x[384,1536] in float32
and in bf16 with float32 accumulation, and a checksum of the forward's output
(equal checksums: the setting leaves results unchanged). HF PyTorch's forward
on the same inputs is the baseline of the ratios. Results feed
papa_jax/cpu_tuning.py's table for this CPU kind.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SETTINGS = {
    "default": "",
    "no YNN fusion": "--xla_cpu_experimental_ynn_fusion_type=",
    "no XNNPACK": "--xla_cpu_use_xnnpack=false",
    "oneDNN": "--xla_cpu_use_onednn=true",
    "XNN graph fusion": "--xla_cpu_experimental_xnn_graph_fusion_mode=XNN_GRAPH_FUSION_MODE_GREEDY",
    "XNN fusions": "--xla_cpu_experimental_xnn_fusion_type=dot,eltwise,reduce",
}


def child(repeats: int) -> dict:
  import time  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  import papa_jax as pj  # pylint: disable=import-outside-toplevel
  m = pj.load_pretrained("sentence-transformers/all-MiniLM-L6-v2")
  enc = pj.Encoder(m.config)

  def inputs(b, l):
    rng = np.random.default_rng(0)
    lengths = rng.integers(l // 4, l + 1, size=b)
    mask = (np.arange(l)[None] < lengths[:, None]).astype(np.int32)
    return np.where(mask == 1, rng.integers(1000, 20000, (b, l)), 0).astype(np.int32), mask

  def med(fn, *a):
    jax.block_until_ready(fn(*a))
    ts = []
    for _ in range(repeats):
      t = time.perf_counter()
      jax.block_until_ready(fn(*a))
      ts.append(time.perf_counter() - t)
    return float(np.median(ts))

  ids, mask = inputs(32, 128)
  fwd = jax.jit(lambda p, i, k: enc.apply({"params": p}, i, k).hidden_states)
  ids64, mask64 = inputs(32, 64)
  cap = jax.jit(lambda p, i, k: enc.apply({"params": p}, i, k, capture_attention=True))
  x, w = jnp.ones((4096, 384)), jnp.ones((384, 1536))
  gemm = jax.jit(jnp.matmul)
  gemm16 = jax.jit(lambda a, b: jnp.matmul(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16),
                                           preferred_element_type=jnp.float32))
  flop = 2 * 4096 * 384 * 1536
  out = np.asarray(fwd(m.params, ids, mask)[-1])
  return dict(forward_ex_s=32 / med(fwd, m.params, ids, mask),
              means_fwd_ex_s=32 / med(cap, m.params, ids64, mask64),
              gemm_gflops=flop / med(gemm, x, w) / 1e9,
              gemm_bf16_gflops=flop / med(gemm16, x, w) / 1e9,
              checksum=float(np.abs(out).astype(np.float64).sum()))


def torch_child(repeats: int) -> dict:
  import time  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  from transformers import AutoModel  # pylint: disable=import-outside-toplevel
  from papa_jax import convert  # pylint: disable=import-outside-toplevel
  torch.set_num_threads(os.cpu_count() or 1)
  model = AutoModel.from_pretrained(
      convert.packaged_model_dir("sentence-transformers/all-MiniLM-L6-v2"),
      attn_implementation="eager").eval()
  rng = np.random.default_rng(0)
  lengths = rng.integers(32, 129, size=32)
  mask = torch.tensor((np.arange(128)[None] < lengths[:, None]).astype(np.int64))
  ids = torch.tensor(rng.integers(1000, 20000, (32, 128))) * mask
  ts = []
  with torch.no_grad():
    for i in range(repeats + 2):
      t = time.perf_counter()
      model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
      if i >= 2:
        ts.append(time.perf_counter() - t)
  return dict(forward_ex_s=32 / float(np.median(ts)))


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--repeats", type=int, default=7)
  ap.add_argument("--child", default="")
  ap.add_argument("--json", default="")
  args = ap.parse_args()
  if args.child:
    print(json.dumps(torch_child(args.repeats) if args.child == "torch" else
                     child(args.repeats)))
    return
  from benchmarks import common  # pylint: disable=import-outside-toplevel
  env = dict(os.environ, HF_HUB_OFFLINE="1")
  env.pop("XLA_FLAGS", None)

  def run(kind, flags=""):
    return common.child(__file__, "--child", kind, "--repeats", str(args.repeats),
                        env=dict(env, XLA_FLAGS=flags))

  torch_fwd = run("torch")["forward_ex_s"]
  rows = []
  for name, flags in SETTINGS.items():
    r = run("jax", flags)
    rows.append(dict(setting=name, forward_ex_s=r["forward_ex_s"],
                     vs_torch=r["forward_ex_s"] / torch_fwd, means_fwd_ex_s=r["means_fwd_ex_s"],
                     gemm_gflops=r["gemm_gflops"], gemm_bf16_gflops=r["gemm_bf16_gflops"],
                     same_numbers=bool(r["checksum"] == rows[0]["checksum"]) if rows else True,
                     checksum=r["checksum"]))
    print(rows[-1], flush=True)
  for r in rows:
    r.pop("checksum")
  common.report(f"XLA-CPU settings, MiniLM (HF PyTorch forward {torch_fwd:.1f} ex/s)", rows,
                args.json or None)


if __name__ == "__main__":
  main()
