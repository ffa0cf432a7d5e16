"""Tests for tools/gpu_bundle.py: the wheels it fetches (one pinned version of each package the
GPU host's image lacks, for the host's Python and platform) and the tasks it prepares. Nothing
is downloaded here: pip and the data preparation are stood in for."""

import importlib.metadata
import os
import re
import tomllib

from tools import gpu_bundle
from tools import gpu_job

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_package_the_host_lacks_is_fetched_at_the_version_installed_here(
    tmp_path, monkeypatch):
  wheels = tmp_path / "wheels"
  wheels.mkdir()
  (wheels / "old-0.1-py3-none-any.whl").write_text("")
  commands = []
  monkeypatch.setattr(gpu_bundle.subprocess, "run", lambda command, check: commands.append(command))
  gpu_bundle.download_wheels(str(wheels))
  assert list(wheels.iterdir()) == []  # emptied first: one version of each package
  assert len(commands) == len(gpu_bundle.IMAGE_LACKS)
  for name, command in zip(gpu_bundle.IMAGE_LACKS, commands):
    pinned = f"{name}=={importlib.metadata.version(name)}"  # installed here, or this raises
    assert command[-1] == pinned and "--no-deps" in command
    if name in gpu_bundle.SOURCE_ONLY:
      assert command[3] == "wheel"
    else:
      assert command[3] == "download" and "--only-binary=:all:" in command
      assert command[command.index("--python-version") + 1] == gpu_bundle.PYTHON_VERSION
      assert [c for c in command if c.startswith("--platform=")
             ] == [f"--platform={p}" for p in gpu_bundle.PLATFORMS]
      assert command[command.index("-d") + 1] == str(wheels)


def test_every_dependency_is_in_the_image_or_in_the_bundle():
  """sacremoses, added to pyproject.toml, was in neither: relpos would not import on the GPU
  host, and the first job would end at its import check."""
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    dependencies = tomllib.load(f)["project"]["dependencies"]
  names = {re.split(r"[<>=!~ \[]", d, maxsplit=1)[0].lower() for d in dependencies}
  known = {n.lower() for n in gpu_bundle.IMAGE_HAS + gpu_bundle.IMAGE_LACKS}
  assert names - known == set()
  assert not set(gpu_bundle.IMAGE_HAS) & set(gpu_bundle.IMAGE_LACKS)


def test_the_table_jobs_tasks_are_prepared_in_the_bundle(tmp_path, monkeypatch):
  prepared = []
  monkeypatch.setattr(gpu_bundle.pipeline, "get_task", prepared.append)
  gpu_bundle.prepare_data(str(tmp_path), "/raw/multi30k")
  assert len(prepared) == len(gpu_job.TASKS)
  assert all(task.tfds_data_dir == str(tmp_path) for task in prepared)
  assert [task.manual_dir for task in prepared if task.name == "multi30k"] == ["/raw/multi30k"] * 2
