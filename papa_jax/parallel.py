"""Device mesh, shardings and multi-process start-up (data parallelism only)."""

from __future__ import annotations

import os
from typing import Callable

import jax
import numpy as np
from absl import logging
from jax.flatten_util import ravel_pytree
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

DATA = "data"


def maybe_initialize_distributed(config) -> None:
  """`jax.distributed.initialize` when `config.distributed.enabled` (explicit).

  Coordinator address, process count and id come from the config, or, when
  left empty/-1, from the platform (TPU pods and SLURM fill them in).
  """
  d = config.distributed
  if not d.enabled:
    return
  if jax.distributed.is_initialized():
    return
  if d.cpu_collectives:  # Must not touch the backend before initialize().
    jax.config.update("jax_cpu_collectives_implementation", d.cpu_collectives)
  kwargs = {}
  if d.coordinator_address:
    kwargs["coordinator_address"] = d.coordinator_address
  if d.num_processes > 0:
    kwargs["num_processes"] = d.num_processes
  if d.process_id >= 0:
    kwargs["process_id"] = d.process_id
  if d.local_device_count > 0:
    kwargs["local_device_ids"] = list(range(d.local_device_count))
  jax.distributed.initialize(**kwargs)
  logging.info("Process %d of %d; %d local / %d global devices.", jax.process_index(),
               jax.process_count(), jax.local_device_count(), jax.device_count())


def make_mesh(num_devices: int = -1) -> Mesh:
  """A 1-D data-parallel mesh over the first `num_devices` devices (-1: all)."""
  devices = jax.devices()
  if num_devices > 0:
    if num_devices > len(devices):
      raise ValueError(f"mesh.num_devices={num_devices} but only {len(devices)} devices exist.")
    if jax.process_count() > 1 and num_devices != len(devices):
      raise ValueError("Multi-process runs must use every device (mesh.num_devices=-1).")
    devices = devices[:num_devices]
  return Mesh(np.asarray(devices), (DATA,))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(DATA))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def check_batch_size(batch_size: int, mesh: Mesh, what: str) -> None:
  if batch_size % mesh.size:
    raise ValueError(f"{what}={batch_size} is not divisible by the {mesh.size} devices of "
                     "the mesh; choose a multiple (the last batch is padded anyway).")


def put_batch(batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """Host batch -> global arrays sharded over `data` (this host's rows only)."""
  sharding = batch_sharding(mesh)
  if jax.process_count() == 1:
    return jax.device_put(batch, sharding)
  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}


def put_replicated(tree, mesh: Mesh):
  return jax.device_put(tree, replicated(mesh))


def sharded_sum(fn: Callable, mesh: Mesh) -> Callable:
  """`jit(shard_map(fn))` whose outputs (sums over the batch) are psum-med once.

  `fn(replicated, local_batch) -> pytree of float32 sums` runs per device on
  its rows; the pytree is flattened into one vector and reduced with a single
  `psum` over `data`, so the program holds exactly one collective (many small
  all-reduces can deadlock XLA's CPU collectives when devices outnumber cores).
  """
  def local(params, batch):
    flat, unravel = ravel_pytree(fn(params, batch))
    return unravel(jax.lax.psum(flat, DATA))
  return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P(DATA)), out_specs=P()))


def is_main_process() -> bool:
  return jax.process_index() == 0


def fingerprint_env() -> dict:
  return dict(process_index=jax.process_index(), process_count=jax.process_count(),
              devices=jax.device_count(), backend=jax.default_backend(),
              xla_flags=os.environ.get("XLA_FLAGS", ""))
