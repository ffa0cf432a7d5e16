"""The device mesh of a run and each process's share of a batch's rows."""
import jax
import numpy as np
from jax.sharding import Mesh

from relpos.data import pipeline

DATA_AXIS = "data"


def make_mesh() -> Mesh:
  """A 1-D mesh over every device of every process, axis DATA_AXIS (batch rows split over it)."""
  return Mesh(np.asarray(jax.devices()), (DATA_AXIS,))


def process_rows(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """This process's contiguous share of the rows of a batch that every process holds whole.

  Args:
    batch: name -> [rows, ...] arrays, rows divisible by the process count.

  Returns:
    name -> [rows / process count, ...]: this process's block (`pipeline.shard_rows`).
  """
  return pipeline.shard_rows(batch, jax.process_index(), jax.process_count())
