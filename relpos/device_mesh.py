"""The device mesh of a run and each process's share of a batch's rows."""
import jax
import numpy as np
from jax.sharding import Mesh

from relpos.data import batching

DATA_AXIS = "data"


def make_mesh() -> Mesh:
  """A 1-D mesh over every device of every process, axis DATA_AXIS (batch rows split over it),
  each process's devices side by side (`in_process_order`)."""
  return Mesh(np.asarray(in_process_order(jax.devices())), (DATA_AXIS,))


def in_process_order(devices: list) -> list:
  """`devices` sorted by process, then id: the rows a process puts on its devices
  (`process_rows`, a contiguous block) are then that block of the global batch, which the
  caller pairs with its examples. `jax.devices()` may interleave processes (some TPU
  topologies); on CPU and GPU it is already in this order."""
  return sorted(devices, key=lambda d: (d.process_index, d.id))


def process_rows(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """This process's contiguous share of the rows of a batch that every process holds whole.

  Args:
    batch: name -> [rows, ...] arrays, rows divisible by the process count.

  Returns:
    name -> [rows / process count, ...]: this process's block (`batching.shard_rows`).
  """
  return batching.shard_rows(batch, jax.process_index(), jax.process_count())
