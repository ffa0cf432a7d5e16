"""Tests for relpos.device_mesh: the mesh and the process rows."""
import numpy as np

from relpos import device_mesh


def test_mesh_and_process_rows():
  mesh = device_mesh.make_mesh()
  assert mesh.axis_names == (device_mesh.DATA_AXIS,)
  batch = {"inputs": np.arange(8).reshape(4, 2)}
  np.testing.assert_array_equal(device_mesh.process_rows(batch)["inputs"], batch["inputs"])
