"""The memory plan (`papa_jax/memory_plan.py`) against the programs XLA compiles, per kind.

  python benchmarks/memory_plan.py                      # the docs/performance.md table
  python benchmarks/memory_plan.py --sizes base --batch 32 --length 128

For each encoder shape (random parameters' shapes only: nothing is run), each program kind
is compiled on this machine's backend from the library's own steps (the means step, the
every-hidden-state forward, a probe step on gated heads, whose gradient runs through the
encoder, and one on constant heads), and its memory analysis (arguments + outputs +
temporaries - donated) is printed beside the plan's count, then the plan at 1 device for
every stage kind with the memory sizes it fits ("fits on 16 / 40 / 80 GiB").
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import papa_jax as pj  # noqa: E402
from benchmarks import common  # noqa: E402
from benchmarks.accelerator import OPT  # noqa: E402
from papa_jax import memory_plan, runner  # noqa: E402
from papa_jax.models.encoder import init_params  # noqa: E402
from papa_jax.papa import means  # noqa: E402
from papa_jax.probing import probes, train  # noqa: E402

SIZES = {  # Hugging Face shapes (vocabulary sizes as published).
    "tiny": dict(vocab_size=1000, hidden_size=128, num_layers=2, num_heads=2,
                 intermediate_size=512, max_position_embeddings=512),
    "minilm": dict(vocab_size=30522, hidden_size=384, num_layers=6, num_heads=12,
                   intermediate_size=1536, max_position_embeddings=512),
    "base": dict(vocab_size=30522, hidden_size=768, num_layers=12, num_heads=12,
                 intermediate_size=3072, max_position_embeddings=512),
    "large": dict(vocab_size=30522, hidden_size=1024, num_layers=24, num_heads=16,
                  intermediate_size=4096, max_position_embeddings=512),
}


def compiled(kind: str, c: pj.EncoderConfig, batch: int, length: int) -> int:
  """Bytes of the compiled program of `kind` (`memory_plan.KINDS`) for one device."""
  params = jax.eval_shape(lambda: init_params(c))
  sds = jax.ShapeDtypeStruct
  x = dict(input_ids=sds((batch, length), jnp.int32),
           attention_mask=sds((batch, length), jnp.int32),
           token_type_ids=sds((batch, length), jnp.int32), valid=sds((batch,), jnp.bool_),
           labels=sds((batch,), jnp.int32))
  if kind == "capture":
    stat = means.AttentionSums("raw")
    lowered = jax.jit(runner.device_sums(c, stat.capture, stat)).lower((params,), x)
  elif kind == "forward":
    enc = pj.Encoder(c)
    lowered = jax.jit(lambda p, b: enc.apply(
        {"params": p}, b["input_ids"], b["attention_mask"], b["token_type_ids"]).hidden_states
                      ).lower(params, x)
  else:
    consts = sds((c.num_layers, c.num_heads, length, length), jnp.float32)
    gates = jnp.zeros((c.num_layers, c.num_heads))
    override = ((lambda C: pj.AttentionOverride.gated(C, gates)) if kind == "through" else
                pj.AttentionOverride.constant)
    frozen = jax.eval_shape(lambda p, C: train.FrozenEncoder(p, override(C), c), params, consts)
    probe = probes.SentenceProbe(2, c.hidden_size, 0.1)
    tx = train.make_optimizer(OPT, gate_learning_rate=0.01)
    state = jax.eval_shape(lambda f: train.init_state(probe, f, tx, 0, length), frozen)
    step = jax.jit(train.make_train_step(probe, tx, 0), donate_argnums=0)
    lowered = step.lower(state, x, frozen)
  m = lowered.compile().memory_analysis()
  return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
             - m.alias_size_in_bytes)


def planned(kind: str, c: pj.EncoderConfig, batch: int, length: int) -> int:
  params = memory_plan.param_bytes(jax.eval_shape(lambda: init_params(c)))
  return memory_plan.program(kind, c, params, batch, length).total


def main(argv=None) -> list[dict]:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--sizes", default="minilm,base,large")
  ap.add_argument("--batch", type=int, default=32)
  ap.add_argument("--length", type=int, default=128)
  ap.add_argument("--dtype", default="float32")
  ap.add_argument("--no-compile", action="store_true", help="the plan only")
  args = ap.parse_args(argv)
  print(common.machine_line(common.machine()))
  rows = []
  print(f"\nbatch {args.batch} x {args.length} tokens per device, {args.dtype}; GiB")
  print("| model | kind | plan | compiled (CPU) | plan / compiled | fits on 16 / 40 / 80 GiB |")
  print("|---|---|---:|---:|---:|---|")
  for size in args.sizes.split(","):
    c = pj.EncoderConfig(**SIZES[size], compute_dtype=args.dtype)
    for kind in memory_plan.KINDS:
      plan = planned(kind, c, args.batch, args.length)
      comp = None if args.no_compile else compiled(kind, c, args.batch, args.length)
      fits = " / ".join("yes" if plan <= gb * 2**30 else "no" for gb in (16, 40, 80))
      rows.append(dict(model=size, kind=kind, plan=plan, compiled=comp))
      print(f"| {size} | {kind} | {plan / 2**30:.2f} | "
            f"{'' if comp is None else f'{comp / 2**30:.2f}'} | "
            f"{'' if comp is None else f'{plan / comp:.2f}'} | {fits} |", flush=True)
  return rows


if __name__ == "__main__":
  main()
