"""Encoder forward and attention-means pass at two commits, with HF PyTorch, interleaved.

  python benchmarks/regression_ab.py [--old 12dd926] [--new HEAD] [--rounds 4]

`--old`/`--new` are git revisions (checked out into worktrees under `--out`)
or directories holding a tree (`--new .` times the working tree as it is);
`--old-env`/`--new-env NAME=VALUE` (repeatable) set a side's environment, e.g.
`--old HEAD --new HEAD --new-env XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=`
compares a setting at one commit.
Every round starts one child process per side (old, new, HF), in an order
that rotates between rounds, so drift and other jobs on the machine hit every
side alike. Each child imports its own tree's `papa_jax`, applies that tree's
`cpu_tuning` (as its launcher does; none before it existed), compiles once and
times every workload `--repeats` times, alternating them:

  forward:   MiniLM-L6 b32 L128, every hidden state (encoder_throughput.py's "Flax")
  means64/128: the raw means pass, 4 batches of 32 (attention_means.py's child)
  means*_a:  the same pass summing only A, where the tree also sums the controls'
             extras (what the pass did at 12dd926; HF sums only A)

Prints examples/s (median over every timed call), the spread of the rounds'
medians, user CPU milliseconds per example (all threads; steadier than wall time
when other jobs share the cores), and each side's ratio to HF as the median over
rounds of per-round ratios. CPU float32.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import common  # noqa: E402
from benchmarks.attention_means import MINILM, _batches  # noqa: E402

MEANS_BATCHES = 4  # Batches per timed means pass, as attention_means.py.


def _flax_workloads(lengths: list[int], batch: int, fwd_length: int) -> dict:
  """name -> (examples per call, fn) with the imported tree's papa_jax."""
  import inspect
  import jax
  import numpy as np
  import papa_jax as pj
  from papa_jax import parallel
  from papa_jax.papa import means
  model = pj.load_pretrained(MINILM)
  cfg, enc, mesh = model.config, pj.Encoder(model.config), parallel.make_mesh(1)
  fwd = jax.jit(lambda p, i, m: enc.apply({"params": p}, i, m).hidden_states)
  b = _batches(cfg.vocab_size, batch, fwd_length, 1)[0]
  out = {"forward": (batch, lambda: jax.block_until_ready(
      fwd(model.params, b["input_ids"], b["attention_mask"])))}
  old_api = "batch_size" not in inspect.signature(means.accumulate).parameters
  for length in lengths:
    batches = _batches(cfg.vocab_size, batch, length, MEANS_BATCHES)
    n = batch * MEANS_BATCHES
    if old_api:  # Batches as a list and a state to add into (before the runner).
      out[f"means{length}"] = (n, lambda bs=batches, L=length: means.accumulate(
          cfg, model.params, bs, mesh, state=means.MeansState.zeros(cfg, L)))
      continue
    data = {k: np.concatenate([x[k] for x in batches])
            for k in ("input_ids", "attention_mask", "token_type_ids")}
    out[f"means{length}"] = (n, lambda d=data: means.accumulate(
        cfg, model.params, d, mesh, batch_size=batch))
    if getattr(means, "EXTRAS", ()):
      from papa_jax import runner

      class AttentionOnly(means.AttentionSums):
        def __call__(self, outs, batch, mask, params):
          return {"attention": super().__call__(outs, batch, mask, params)["attention"]}

      stat = AttentionOnly("raw")
      out[f"means{length}_a"] = (n, lambda d=data, s=stat: runner.sum_pass(
          s, s.capture, cfg, (model.params,), d, mesh, batch_size=batch))
  return out


def _hf_workloads(lengths: list[int], batch: int, fwd_length: int) -> dict:
  """The same workloads with HF PyTorch (eager attention), as the two benchmarks run them."""
  import torch
  from transformers import BertModel
  from papa_jax import convert
  common.set_torch_threads()
  hf = BertModel.from_pretrained(convert.resolve_model_dir(MINILM),
                                 attn_implementation="eager").eval()
  cfg = hf.config

  def tensors(bs):
    return [{k: torch.tensor(v, dtype=torch.long) for k, v in x.items() if k != "valid"}
            for x in bs]

  def pass_(data, length):
    sums = torch.zeros(cfg.num_hidden_layers, cfg.num_attention_heads, length, length,
                       dtype=torch.float64)
    counts = torch.zeros(length, length, dtype=torch.float64)
    with torch.inference_mode():
      for x in data:
        out = hf(**x, output_attentions=True)
        m = x["attention_mask"].float()
        pair = m[:, :, None] * m[:, None, :]
        for layer, a in enumerate(out.attentions):
          sums[layer] += torch.einsum("bhqk,bqk->hqk", a, pair).double()
        counts += pair.sum(0).double()

  def forward(x):
    with torch.inference_mode():
      return hf(**x, output_hidden_states=True)

  b = tensors(_batches(cfg.vocab_size, batch, fwd_length, 1))[0]
  out = {"forward": (batch, lambda: forward(b))}
  for length in lengths:
    data = tensors(_batches(cfg.vocab_size, batch, length, MEANS_BATCHES))
    out[f"means{length}"] = (batch * MEANS_BATCHES, lambda d=data, L=length: pass_(d, L))
  return out


def child(side: str, tree: str, lengths: list[int], repeats: int, batch: int = 32,
          fwd_length: int = 128) -> dict:
  """Times every workload `repeats` times, alternating; seconds per example."""
  sys.path.insert(0, tree)  # After benchmarks.common is imported: papa_jax from `tree`.
  try:
    from papa_jax import cpu_tuning
    cpu_tuning.apply()
  except ImportError:  # A tree from before cpu_tuning: XLA's defaults.
    pass
  loads = (_hf_workloads if side == "hf" else _flax_workloads)(lengths, batch, fwd_length)
  for _, fn in loads.values():
    fn()  # Compile / warm up.
  res = {k: dict(wall=[], user=[]) for k in loads}
  for _ in range(repeats):
    for k, (n, fn) in loads.items():
      time.sleep(0.2)  # Let the previous workload's worker threads go idle.
      u, t = resource.getrusage(resource.RUSAGE_SELF).ru_utime, time.perf_counter()
      fn()
      res[k]["wall"].append((time.perf_counter() - t) / n)
      res[k]["user"].append((resource.getrusage(resource.RUSAGE_SELF).ru_utime - u) / n)
  return dict(results=res, xla_flags=os.environ.get("XLA_FLAGS", ""))


def _tree(rev: str, out: str) -> tuple[str, str]:
  """(label, directory) for a revision or a directory."""
  if os.path.isdir(rev):
    return f"{rev} (tree)", os.path.abspath(rev)
  git = ["git", "-C", ROOT]
  sha = subprocess.run([*git, "rev-parse", rev], check=True, capture_output=True,
                       text=True).stdout.strip()
  tree = os.path.join(out, f"tree_{sha[:8]}")
  if not os.path.isdir(tree):
    subprocess.run([*git, "worktree", "add", "--detach", tree, sha], check=True,
                   capture_output=True)
  return f"{rev} ({sha[:8]})", tree


def _run_child(side: str, tree: str, args) -> dict:
  cmd = [sys.executable, os.path.abspath(__file__), "--child", side, "--tree", tree,
         "--lengths", args.lengths, "--repeats", str(args.repeats), "--batch", str(args.batch),
         "--length", str(args.length)]
  env = dict(os.environ, **dict(getattr(args, f"{side}_env")))
  proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tree, env=env)
  line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
  if not line:
    raise SystemExit(f"{side} child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
  return json.loads(line[0][7:])


def table(runs: dict[str, list[dict]], labels: dict[str, str]) -> list[str]:
  """Markdown rows: per workload and side, examples/s (median of every timed call), the
  range of the processes' medians, user CPU ms per example, and the ratio to HF (median
  over rounds of HF's median time / the side's; a `_a` workload is compared with HF's
  plain one, which sums A alone too)."""
  lines = ["| workload | side | examples/s | rounds' medians | user CPU ms/example | vs HF |",
           "|---|---|---|---|---|---|"]
  keys = list(dict.fromkeys(k for s in ("old", "new") for k in runs[s][0]["results"]))
  for k in keys:
    hf_key = k.removesuffix("_a")
    hf = [statistics.median(x["results"][hf_key]["wall"]) for x in runs["hf"]]
    for s in ("hf", "old", "new"):
      if k not in runs[s][0]["results"]:
        continue
      res = [x["results"][k] for x in runs[s]]
      meds = [statistics.median(x["wall"]) for x in res]
      wall = statistics.median(w for x in res for w in x["wall"])
      user = statistics.median(u for x in res for u in x["user"])
      vs = statistics.median(h / w for h, w in zip(hf, meds))
      lines.append(f"| {k} | {labels[s]} | {1 / wall:.1f} | {1 / max(meds):.1f}-"
                   f"{1 / min(meds):.1f} | {1e3 * user:.2f} | {vs:.2f} |")
  return lines


def _name_value(text: str) -> tuple[str, str]:
  name, eq, value = text.partition("=")
  if not eq or not name:
    raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
  return name, value


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--old", default="12dd926")
  ap.add_argument("--new", default="HEAD")
  for side in ("old", "new"):
    ap.add_argument(f"--{side}-env", action="append", default=[], type=_name_value,
                    metavar="NAME=VALUE", help=f"environment of the {side} side's processes")
  ap.add_argument("--hf-env", action="append", default=[], help=argparse.SUPPRESS)
  ap.add_argument("--rounds", type=int, default=4, help="child processes per side")
  ap.add_argument("--repeats", type=int, default=5, help="timed calls per child and workload")
  ap.add_argument("--lengths", default="64,128", help="means-pass lengths")
  ap.add_argument("--batch", type=int, default=32)
  ap.add_argument("--length", type=int, default=128, help="the forward's length")
  ap.add_argument("--out", default="/tmp/regression_ab")
  ap.add_argument("--child", default="")
  ap.add_argument("--tree", default="")
  args = ap.parse_args()
  lengths = [int(x) for x in args.lengths.split(",")]
  if args.child:
    print("RESULT " + json.dumps(child(args.child, args.tree, lengths, args.repeats,
                                       args.batch, args.length)))
    return
  os.makedirs(args.out, exist_ok=True)
  m = common.machine()
  print(f"{common.machine_line(m)}; load {os.getloadavg()[0]:.2f} at start", flush=True)
  sides = dict(hf=("HF PyTorch", ROOT), old=_tree(args.old, args.out),
               new=_tree(args.new, args.out))
  for s in ("old", "new"):
    env = getattr(args, f"{s}_env")
    if env:
      sides[s] = (f"{sides[s][0]} " + " ".join(f"{k}={v}" for k, v in env), sides[s][1])
  runs = {s: [] for s in sides}
  for r in range(args.rounds):
    order = list(sides)[r % 3:] + list(sides)[:r % 3]
    for s in order:
      runs[s].append(_run_child(s, sides[s][1], args))
      print(f"round {r} {s} done (load {os.getloadavg()[0]:.2f}); XLA_FLAGS "
            f"{runs[s][-1]['xla_flags']!r}", flush=True)
  print(f"\nload {os.getloadavg()[0]:.2f} at end; {args.rounds} processes per side, "
        f"{args.repeats} timed calls each\n")
  print("\n".join(table(runs, {k: v[0] for k, v in sides.items()})))


if __name__ == "__main__":
  main()
