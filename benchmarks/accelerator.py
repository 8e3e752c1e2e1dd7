"""MFU of the three hot loops on this machine's default JAX device, and vs HF PyTorch.

  python benchmarks/accelerator.py                 # BERT-base, 256 x 128, bf16 and float32
  python benchmarks/accelerator.py --small         # a CPU-sized model (CI runs this)

Loops (a randomly initialised BERT-base-sized encoder; weights do not change speed):
  forward  the dynamic encoder forward, every hidden state out (the fused
           `jax.nn.dot_product_attention` path where `backend.use_fused_attention()`);
  means    the attention-means step: forward with every attention map captured
           and the masked sums (`papa.means.AttentionSums` on `papa_jax.runner`);
  probe    one probe training step with all heads constant (PAPA's fast path:
           no queries or keys), encoder frozen, AdamW on the probe.
Then the quickstart (configs/quickstart.py with 0 and all heads constant: the means pass,
the constants and the probes, compiled for this device as a user's run is) on this device,
and the same in a child process on the CPU in float32; the two workdirs compared as
`compare_workdirs.py` does (difference with its paired bootstrap interval, changed dev
predictions), against the bf16 bound of docs/performance.md. SPLADE-tiny by default (small
enough to carry to a lent machine, and quick on its CPU); `--quickstart-model minilm` for the
README's. Each row also gives the memory plan of the launcher's check (`papa_jax/memory_plan.py`) and,
where the device reports it (GPU, TPU), its peak memory so far. MFU = model FLOPs / time /
the device's dense bf16 peak. Model FLOPs are
counted analytically (matmuls only: projections, FFN, QK^T, AV and the
probe's dense layers, x3 for the probe's forward and backward); the
constant-attention forward has no Q/K projections or QK^T. On a CPU there is
no published peak: the table gives the fraction of a same-dtype 2048^2 jit
matmul measured in this process instead. HF PyTorch runs the same shapes on
the same device (GPU: bf16 weights, SDPA for the forward, eager attention with
`output_attentions` for the means; its probe step is the frozen dynamic
forward under no_grad plus the same probe, as the original PAPA code has no
constant-attention shortcut).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from ml_collections import ConfigDict  # noqa: E402

import papa_jax as pj  # noqa: E402
from benchmarks import common, compare_workdirs  # noqa: E402
from papa_jax.probing import probes, train  # noqa: E402
from papa_jax import backend, memory_plan, runner, suite  # noqa: E402
from papa_jax.models.encoder import init_params  # noqa: E402
from papa_jax.papa import means  # noqa: E402

# Dense bf16 peak FLOP/s by device kind (vendor datasheets, without sparsity).
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12,
             "A10G": 70e12, "V100": 125e12, "TPU v4": 275e12, "TPU v5 lite": 197e12,
             "TPU v5e": 197e12, "TPU v5p": 459e12, "TPU v6 lite": 918e12, "TPU v6e": 918e12}
OPT = ConfigDict(dict(learning_rate=2e-5, adam_b1=0.9, adam_b2=0.999, adam_eps=1e-8,
                      weight_decay=0.0, grad_clip_norm=1.0))
# docs/performance.md: the quickstart in bfloat16 vs float32 on 872 dev sentences, 95% CI
# within +-0.0034 (at most one prediction changed per probe).
BF16_BOUND = 0.0034
PLAN_KIND = {"forward": "forward", "means": "capture", "probe": "probe"}
SIZES = {
    "base": dict(vocab_size=30522, hidden_size=768, num_layers=12, num_heads=12,
                 intermediate_size=3072, max_position_embeddings=512),
    "small": dict(vocab_size=1000, hidden_size=128, num_layers=2, num_heads=4,
                  intermediate_size=512, max_position_embeddings=64),
}


def device_peak() -> float | None:
  kind = jax.devices()[0].device_kind
  for key in sorted(PEAK_BF16, key=len, reverse=True):
    if key.lower() in kind.lower():
      return PEAK_BF16[key]
  return None


def model_flops(c: pj.EncoderConfig, batch: int, length: int, *, constant: bool = False) -> float:
  """Matmul FLOPs of one forward; `constant`: no Q/K projections and no QK^T."""
  d, f, l = c.hidden_size, c.intermediate_size, length
  proj = (2 if constant else 4) * 2 * l * d * d
  scores = (1 if constant else 2) * 2 * l * l * d
  return batch * c.num_layers * (proj + 2 * 2 * l * d * f + scores)


def probe_flops(c: pj.EncoderConfig, batch: int, length: int, labels: int = 2) -> float:
  """The PAPA sentence probe's forward + backward (3x forward)."""
  k, d = c.num_hidden_states, c.hidden_size
  return 3 * batch * (2 * k * length * d + 2 * k * d * d + 2 * d * labels)


def _inputs(c: pj.EncoderConfig, batch: int, length: int) -> dict:
  rng = np.random.default_rng(0)
  ids = rng.integers(1000 % c.vocab_size, c.vocab_size, (batch, length)).astype(np.int32)
  return dict(input_ids=ids, attention_mask=np.ones_like(ids), token_type_ids=np.zeros_like(ids),
              valid=np.ones(batch, bool), labels=rng.integers(0, 2, batch).astype(np.int32))


def _time(fn, repeats: int) -> float:
  return common.median_seconds(lambda: jax.block_until_ready(fn()), repeats, warmup=2)


def jax_loops(c: pj.EncoderConfig, batch: int, length: int, repeats: int) -> dict[str, float]:
  """Seconds per call of each loop in JAX."""
  params = init_params(c)
  b = jax.device_put(_inputs(c, batch, length))
  enc = pj.Encoder(c)
  fwd = jax.jit(lambda p, x: enc.apply({"params": p}, x["input_ids"], x["attention_mask"],
                                       x["token_type_ids"]).hidden_states)
  stat = means.AttentionSums("raw")
  sums_fn = jax.jit(runner.device_sums(c, stat.capture, stat))
  sums = lambda p, x: sums_fn((p,), x)
  constants = jnp.full((c.num_layers, c.num_heads, length, length), 1.0 / length)
  frozen = train.FrozenEncoder(params, pj.AttentionOverride.constant(constants), c,
                               feature_dtype="bfloat16" if c.compute_dtype == "bfloat16"
                               else "float32")
  probe = probes.SentenceProbe(2, c.hidden_size, 0.1)
  tx = train.make_optimizer(OPT)
  holder = [train.init_state(probe, frozen, tx, 0, length)]
  step = jax.jit(train.make_train_step(probe, tx, 0), donate_argnums=0)

  def probe_step():
    holder[0], loss = step(holder[0], b, frozen)
    return loss

  out, peaks = {}, {}
  for name, fn in (("forward", lambda: fwd(params, b)), ("means", lambda: sums(params, b)),
                   ("probe", probe_step)):
    out[name] = _time(fn, repeats)
    peaks[name] = (jax.local_devices()[0].memory_stats() or {}).get("peak_bytes_in_use")
  return out, peaks


def torch_loops(c: pj.EncoderConfig, batch: int, length: int, repeats: int,
                bf16: bool) -> dict[str, float]:
  """Seconds per call of the same loops in HF PyTorch on the same kind of device."""
  import torch
  from torch import nn
  from transformers import BertConfig, BertModel
  dev = "cuda" if torch.cuda.is_available() and jax.default_backend() == "gpu" else "cpu"
  if dev == "cpu":
    common.set_torch_threads()
  dtype = torch.bfloat16 if bf16 else torch.float32
  cfg = BertConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size,
                   num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
                   intermediate_size=c.intermediate_size,
                   max_position_embeddings=c.max_position_embeddings)
  cfg._attn_implementation = "sdpa"  # pylint: disable=protected-access
  sdpa = BertModel(cfg).to(dev, dtype).eval()
  eager = BertModel(BertConfig(**{**cfg.to_dict(), "attn_implementation": "eager"}))
  eager = eager.to(dev, dtype).eval()
  x = {k: torch.tensor(v, dtype=torch.long, device=dev)
       for k, v in _inputs(c, batch, length).items()
       if k in ("input_ids", "attention_mask", "token_type_ids")}
  labels = torch.tensor(_inputs(c, batch, length)["labels"], dtype=torch.long, device=dev)
  k, d = c.num_hidden_states, c.hidden_size
  w = nn.Parameter(torch.full((k, length), 1.0 / length, device=dev))
  dense, cls = nn.Linear(k * d, d).to(dev), nn.Linear(d, 2).to(dev)
  opt = torch.optim.AdamW([w, *dense.parameters(), *cls.parameters()], lr=2e-5)
  pair = (x["attention_mask"][:, :, None] * x["attention_mask"][:, None, :]).to(dtype)

  def sync(out=None):
    if dev == "cuda":
      torch.cuda.synchronize()
    return out

  def forward():
    with torch.no_grad():
      return sync(sdpa(**x, output_hidden_states=True).hidden_states)

  def means_step():
    with torch.no_grad():
      att = eager(**x, output_attentions=True).attentions
      return sync([torch.einsum("bhqk,bqk->hqk", a, pair).float() for a in att])

  def probe_step():
    with torch.no_grad():
      hidden = torch.stack(sdpa(**x, output_hidden_states=True).hidden_states, 1).float()
    v = torch.einsum("bkld,kl,bl->bkd", hidden, w, x["attention_mask"].float())
    loss = nn.functional.cross_entropy(cls(torch.tanh(dense(v.flatten(1)))), labels)
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_([w, *dense.parameters(), *cls.parameters()], 1.0)
    opt.step()
    return sync(loss.item())

  return {name: common.median_seconds(fn, repeats, warmup=2) for name, fn in
          (("forward", forward), ("means", means_step), ("probe", probe_step))}


def matmul_peak(dtype, n: int = 2048, repeats: int = 7) -> float:
  a = jax.random.normal(jax.random.key(0), (n, n), dtype)
  f = jax.jit(lambda x, y: jnp.matmul(x, y, preferred_element_type=jnp.float32))
  return 2 * n**3 / _time(lambda: f(a, a), repeats)


def run(size: str, batch: int, length: int, dtype: str, repeats: int, hf: bool) -> list[dict]:
  c = pj.EncoderConfig(**SIZES[size], compute_dtype=dtype)
  t, peaks = jax_loops(c, batch, length, repeats)
  params = memory_plan.param_bytes(jax.eval_shape(lambda: init_params(c)))
  ref = torch_loops(c, batch, length, repeats, dtype == "bfloat16") if hf else {}
  peak = device_peak()
  measured = None if peak else matmul_peak(jnp.bfloat16 if dtype == "bfloat16" else jnp.float32)
  flops = dict(forward=model_flops(c, batch, length), means=model_flops(c, batch, length),
               probe=model_flops(c, batch, length, constant=True) + probe_flops(c, batch, length))
  rows = []
  for name in ("forward", "means", "probe"):
    achieved = flops[name] / t[name]
    row = dict(loop=name, batch=f"{batch}x{length}", dtype=dtype, ms=1e3 * t[name],
               ex_per_s=batch / t[name], tflop_per_s=achieved / 1e12)
    if peak:
      row["mfu"] = achieved / peak
    else:
      row["of_matmul"] = achieved / measured
    # The memory plan of the launcher's check beside the device's peak so far (GPUs and TPUs
    # report it; the process's peak, so it only grows from loop to loop).
    row["plan_gib"] = memory_plan.program(PLAN_KIND[name], c, params, batch,
                                          length).total / 2**30
    if peaks[name] is not None:
      row["peak_gib"] = peaks[name] / 2**30
    if name in ref:
      row["hf_ms"] = 1e3 * ref[name]
      row["vs_hf"] = ref[name] / t[name]
    rows.append(row)
  return rows


def quickstart_config(model: str, small: bool) -> ConfigDict:
  """configs/quickstart.py on `model` with 0 and all heads constant (no sorting run); `small`:
  64 train and 64 dev sentences, 2 epochs."""
  from configs import quickstart  # pylint: disable=import-outside-toplevel
  c = quickstart.get_config()
  c.model.name = model
  c.papa.fractions = (0.0, 1.0)
  if small:
    c.data.max_train_examples = c.data.max_eval_examples = 64
    c.probe.epochs = 2
  return c


def quickstart_side(model: str, small: bool, workdir: str) -> dict:
  """The quickstart run into `workdir` on this process's default device."""
  from papa_jax import run as run_lib  # pylint: disable=import-outside-toplevel
  t = time.perf_counter()
  run_lib.run(quickstart_config(model, small), workdir)
  return dict(seconds=time.perf_counter() - t, device=jax.devices()[0].device_kind)


def within_bound(row: dict) -> bool:
  """A compared probe equals its CPU reference within the bf16 bound: 0 inside the difference's
  interval and the difference at most `BF16_BOUND`."""
  return row["within_noise"] and abs(row["difference"]) <= BF16_BOUND


def quickstart(model: str, small: bool) -> list[dict]:
  """The quickstart on this device beside the same on the CPU (float32, a child process)."""
  with tempfile.TemporaryDirectory() as root:
    here = quickstart_side(model, small, os.path.join(root, "device"))
    args = ["--quickstart-side", os.path.join(root, "cpu"), "--quickstart-model", model]
    cpu = common.child(__file__, *args, *(["--small"] if small else []),
                       env={**os.environ, "JAX_PLATFORMS": "cpu"})
    rows = compare_workdirs.compare(suite.load_experiment(os.path.join(root, "cpu")),
                                    suite.load_experiment(os.path.join(root, "device")),
                                    n_boot=1000)
  return [dict(model=model, static_heads=r["static_heads"], n_dev=r["n_examples"],
               cpu=r["reference"], device=r["other"], difference=r["difference"],
               difference_ci=f"[{r['difference_ci'][0]:+.4f}, {r['difference_ci'][1]:+.4f}]",
               changed=sum(r["changed_predictions"]), within_bound=within_bound(r),
               device_s=here["seconds"], cpu_s=cpu["seconds"]) for r in rows]


def main(argv=None):
  ap = argparse.ArgumentParser()
  ap.add_argument("--small", action="store_true", help="CPU-sized model, batch 8 x 32")
  ap.add_argument("--batch", type=int, default=0)
  ap.add_argument("--length", type=int, default=0)
  ap.add_argument("--dtype", default="", help="float32 or bfloat16 (default: both off CPU, "
                  "float32 on CPU)")
  ap.add_argument("--repeats", type=int, default=0)
  ap.add_argument("--no-hf", action="store_true")
  ap.add_argument("--json", default="")
  ap.add_argument("--quickstart-model", default="splade_tiny")
  ap.add_argument("--no-quickstart", action="store_true")
  ap.add_argument("--quickstart-side", default="", help="internal: run it into this workdir")
  args = ap.parse_args(argv)
  small = args.small
  if args.quickstart_side:
    print(json.dumps(quickstart_side(args.quickstart_model, small, args.quickstart_side)))
    return []
  dtypes = ([args.dtype] if args.dtype else ["float32"] if jax.default_backend() == "cpu"
            else ["bfloat16", "float32"])
  rows = [r for dtype in dtypes for r in run(
      "small" if small else "base", args.batch or (8 if small else 256),
      args.length or (32 if small else 128), dtype, args.repeats or (3 if small else 10),
      not args.no_hf)]
  peak = device_peak()
  common.report(f"Accelerator loops ({jax.devices()[0].device_kind}, peak "
                f"{f'{peak / 1e12:.0f} TFLOP/s bf16' if peak else 'n/a: fraction of a jit matmul'}"
                f", fused attention {backend.use_fused_attention()})", rows, args.json or None)
  if not args.no_quickstart:
    qs = quickstart(args.quickstart_model, small)
    common.report(f"Quickstart ({args.quickstart_model}, SST-2, 0 and all heads constant) on "
                  f"{jax.devices()[0].device_kind} vs the CPU in float32; bf16 bound "
                  f"+-{BF16_BOUND}", qs, args.json or None)
    rows = rows + qs
  return rows


if __name__ == "__main__":
  common.tune_cpu()  # The launcher's XLA-CPU settings, before JAX starts.
  main()
