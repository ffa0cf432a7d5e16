"""Shared pytest setup: tests run on CPU with 4 host devices for multi-device checks, and what
they prepare without naming a data folder goes to a temporary one, never ~/tensorflow_datasets.

Set JAX_PLATFORMS (e.g. to "" or "cuda") to run on an accelerator instead: tests/test_gpu.py.
"""
import os

import pytest

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
os.environ.setdefault("JAX_PLATFORMS", "cpu")


@pytest.fixture(autouse=True, scope="session")
def default_data_dir(tmp_path_factory: pytest.TempPathFactory):
  """RELPOS_DATA_DIR (the data folder of a config that names none) for the whole session, in
  this process and the programs the tests start: a folder under pytest's temporary one."""
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv("RELPOS_DATA_DIR", str(tmp_path_factory.mktemp("default_data_dir")))
    yield
