"""Tests for relpos.runtime: the line filter of C++ noise, --import of the user's modules and
their record in a workdir, the mesh and the process rows."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from relpos import runtime

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GLOO = (b"[Gloo] Rank ",)


def _filtered(chunks: list[bytes]) -> tuple[bytes, bytes]:
  out, held, at_line_start = b"", b"", True
  for chunk in chunks:
    passed, held, at_line_start = runtime.drop_lines(chunk, held, at_line_start, GLOO)
    out += passed
  return out, held


def test_drop_lines_drops_whole_noise_lines_only():
  assert _filtered([b"[Gloo] Rank 0 is connected to 1 peer ranks.\nresult\n"]) == (b"result\n",
                                                                                   b"")
  # Split across writes; a progress bar's "\r" updates pass at once; other brackets pass.
  assert _filtered([b"[Gl", b"oo] Rank 1 x\n", b"\r 50%|#", b"\r100%\n", b"[tag] y\n"]) == (
      b"\r 50%|#\r100%\n[tag] y\n", b"")
  # Not at the start of a line: kept. A line that may still become noise: held back.
  assert _filtered([b"a [Gloo] Rank 2\n[Gl"]) == (b"a [Gloo] Rank 2\n", b"[Gl")


FILTERED_PROGRAM = """
import os, sys
from relpos import runtime
for stream in (sys.stdout, sys.stderr):
  runtime.LineFilter(stream, (b"[Gloo] Rank ",))
os.write(1, b"[Gloo] Rank 0 is connected to 1 peer ranks.\\n")  # as C++ code writes
os.write(2, b"[Gloo] Rank 1 is connected to 1 peer ranks.\\nwarning: kept\\n")
print('{"step": 2}')
sys.exit("error: the last line")
"""


def test_line_filter_cleans_both_streams_at_the_descriptor_and_loses_nothing_at_exit():
  result = subprocess.run([sys.executable, "-c", FILTERED_PROGRAM], capture_output=True,
                          text=True, timeout=120, check=False, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT})
  assert result.returncode == 1
  assert json.loads(result.stdout) == {"step": 2}
  assert result.stderr == "warning: kept\nerror: the last line\n"


def test_import_modules_and_their_record_in_a_workdir(tmp_path, monkeypatch):
  monkeypatch.setattr(runtime, "_IMPORTED", [])
  module = tmp_path / "mine.py"
  module.write_text("LOADED = True\n")
  runtime.import_modules([str(module), "json"])
  assert sys.modules["mine"].LOADED and runtime.imported() == [str(module), "json"]
  workdir = tmp_path / "run"
  workdir.mkdir()
  runtime.write_imports(str(workdir))
  assert json.loads((workdir / runtime.IMPORTS_FILE).read_text()) == [str(module), "json"]
  runtime.import_recorded(str(workdir))  # the same modules again: nothing changes
  assert runtime.imported() == [str(module), "json"]
  (workdir / runtime.IMPORTS_FILE).write_text('{"not": "a list"}')
  with pytest.raises(ValueError, match="imports.json must hold a JSON list"):
    runtime.import_recorded(str(workdir))
  with pytest.raises(ValueError, match=r"--import=\S*mine\.py: \S*mine\.py lies inside the "
                                       r"workdir"):
    runtime.import_modules([str(module)], refuse_under=str(tmp_path))


@pytest.mark.parametrize("body, words", [("sys.exit(3)", "exited with status 3"),
                                         ("sys.exit()", "exited with status 0"),
                                         ("sys.exit('no GPU here')", "exited (no GPU here)")])
def test_import_of_a_module_that_exits_is_an_error_naming_it(body, words, tmp_path,
                                                              monkeypatch):
  monkeypatch.setattr(runtime, "_IMPORTED", [])
  module = tmp_path / "leaving.py"
  module.write_text(f"import sys\n{body}\n")
  with pytest.raises(ValueError) as raised:
    runtime.import_modules([str(module)])
  assert str(raised.value) == f"--import={module} {words} while being imported."
  assert runtime.imported() == [] and "leaving" not in sys.modules


def test_mesh_and_process_rows():
  mesh = runtime.make_mesh()
  assert mesh.axis_names == (runtime.DATA_AXIS,)
  batch = {"inputs": np.arange(8).reshape(4, 2)}
  np.testing.assert_array_equal(runtime.process_rows(batch)["inputs"], batch["inputs"])


def test_the_source_commit_is_read_once_per_process(monkeypatch):
  """A table running in one process records the code it loaded, not what the tree holds when a
  later run starts."""
  runtime.source_commit.cache_clear()
  first = runtime.source_commit()
  assert first == "unknown" or re.fullmatch(r"[0-9a-f]{7,}(-dirty)?", first)

  def tree_changed(*args, **kwargs):
    raise AssertionError("the tree was read again")

  monkeypatch.setattr(runtime.subprocess, "run", tree_changed)
  assert runtime.source_commit() == first
