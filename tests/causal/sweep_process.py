"""One process of a sweep split over processes (`tests/causal/sweep_processes_test.py`).

  python -m tests.causal.sweep_process OUT PROCESSES PROCESS_ID PORT

A seeded random 3-layer encoder; `patching.sweep` (every layer x two positions x all and one
head, zero source at "context") and `knockout.sweep` (two classes x three windows) on a
seeded padded batch over all devices (`parallel.make_mesh()`); writes this process's results,
and how many chunks it ran, to OUT/process<ID>.npz.
"""

import os
import sys

import jax
import numpy as np


def main(out: str, processes: int, pid: int, port: int) -> None:
  if processes > 1:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"localhost:{port}", processes, pid)
  import papa_jax as pj  # pylint: disable=import-outside-toplevel
  from papa_jax import parallel  # pylint: disable=import-outside-toplevel
  from papa_jax.causal import knockout, patching  # pylint: disable=import-outside-toplevel
  from papa_jax.models.encoder import init_params  # pylint: disable=import-outside-toplevel
  c = pj.EncoderConfig(vocab_size=50, hidden_size=16, num_layers=3, num_heads=2,
                       intermediate_size=24, max_position_embeddings=16)
  model = pj.Pretrained(c, init_params(c, seed=1), "")
  rng = np.random.default_rng(0)
  lengths = np.array([7, 5, 6, 3])
  mask = (np.arange(7)[None] < lengths[:, None]).astype(np.int32)
  batch = dict(input_ids=(rng.integers(1, 50, (4, 7)) * mask).astype(np.int32),
               attention_mask=mask)
  w = rng.normal(size=16).astype(np.float32)
  metric = lambda o, b: o.hidden_states[-1][:, 0] @ w
  zero = np.zeros((3, 4, 7, 2, 8), np.float32)
  targets = pj.Targets.grid(3, positions=(0, 2), heads=(-1, 1))
  blocked = np.zeros((2, 4, 7, 7), bool)
  blocked[0, :, :, 0] = True  # Every query's edge to the first token.
  blocked[1, :, 1:, :-1] = np.eye(6, dtype=bool)  # Each query's edge to the previous token.
  mesh = parallel.make_mesh()
  chunks, ran = patching.process_chunks, []

  def counted(*args):  # How many chunks this process runs, per sweep.
    mine, owner = chunks(*args)
    ran.append(len(mine))
    return mine, owner
  patching.process_chunks = counted  # Both sweeps run their chunks through it.
  got = dict(patched=patching.sweep(model, batch, zero, "context", targets, metric, chunk=2,
                                     mesh=mesh),
             knocked=knockout.sweep(model, batch, blocked, [(0, 0), (1, 2), (2, 2)], metric,
                                    chunk=1, mesh=mesh),
             chunks=np.asarray(ran))
  np.savez(os.path.join(out, f"process{pid}.npz"), **got)


if __name__ == "__main__":
  main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
