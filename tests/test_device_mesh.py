"""Tests for relpos.device_mesh: the mesh and the process rows."""
import types

import jax
import numpy as np

from relpos import device_mesh


def test_mesh_and_process_rows():
  mesh = device_mesh.make_mesh()
  assert mesh.axis_names == (device_mesh.DATA_AXIS,)
  batch = {"inputs": np.arange(8).reshape(4, 2)}
  np.testing.assert_array_equal(device_mesh.process_rows(batch)["inputs"], batch["inputs"])


def test_devices_are_grouped_by_process():
  """Interleaved as some TPU topologies list them, each process's devices end up side by side:
  its block of rows is that block of the global batch."""
  device = lambda process, i: types.SimpleNamespace(process_index=process, id=i)
  interleaved = [device(0, 0), device(1, 4), device(0, 1), device(1, 5)]
  assert [(d.process_index, d.id) for d in device_mesh.in_process_order(interleaved)] == [(0, 0),
                                                                                          (0, 1),
                                                                                          (1, 4),
                                                                                          (1, 5)]
  mesh = device_mesh.make_mesh()
  assert list(mesh.devices.flat) == device_mesh.in_process_order(jax.devices())
