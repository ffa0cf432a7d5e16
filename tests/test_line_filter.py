"""Tests for relpos.line_filter: the line filter of C++ noise, step by step and at the file
descriptors of a process."""
import json
import os
import subprocess
import sys

from relpos import line_filter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GLOO = (b"[Gloo] Rank ",)


def _filtered(chunks: list[bytes]) -> tuple[bytes, bytes]:
  out, held, at_line_start = b"", b"", True
  for chunk in chunks:
    passed, held, at_line_start = line_filter.drop_lines(chunk, held, at_line_start, GLOO)
    out += passed
  return out, held


def test_drop_lines_drops_whole_noise_lines_only():
  assert _filtered([b"[Gloo] Rank 0 is connected to 1 peer ranks.\nresult\n"]) == (b"result\n", b"")
  # Split across writes; a progress bar's "\r" updates pass at once; other brackets pass.
  assert _filtered([b"[Gl", b"oo] Rank 1 x\n", b"\r 50%|#", b"\r100%\n",
                    b"[tag] y\n"]) == (b"\r 50%|#\r100%\n[tag] y\n", b"")
  # Not at the start of a line: kept. A line that may still become noise: held back.
  assert _filtered([b"a [Gloo] Rank 2\n[Gl"]) == (b"a [Gloo] Rank 2\n", b"[Gl")


FILTERED_PROGRAM = """
import os, sys
from relpos import line_filter
for stream in (sys.stdout, sys.stderr):
  line_filter.LineFilter(stream, (b"[Gloo] Rank ",))
os.write(1, b"[Gloo] Rank 0 is connected to 1 peer ranks.\\n")  # as C++ code writes
os.write(2, b"[Gloo] Rank 1 is connected to 1 peer ranks.\\nwarning: kept\\n")
print('{"step": 2}')
sys.exit("error: the last line")
"""


def test_line_filter_cleans_both_streams_at_the_descriptor_and_loses_nothing_at_exit():
  result = subprocess.run([sys.executable, "-c", FILTERED_PROGRAM], capture_output=True, text=True,
                          timeout=120, check=False, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT})
  assert result.returncode == 1
  assert json.loads(result.stdout) == {"step": 2}
  assert result.stderr == "warning: kept\nerror: the last line\n"
