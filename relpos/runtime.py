"""What a run needs of its machine and its folder: processes, the device mesh, the workdir's file
names, and the user's own modules (`--import`).

A workdir holds:

  config.json           the resolved config (data, never code)
  imports.json          the modules the run imported with --import (their variants), if any
  train.lock            held by the training process (relpos.locks)
  metrics.jsonl         train and validation records; tensorboard/ the same as events
  starts.jsonl          one line per start of the run: time, step, source commit, host
  checkpoints/<step>/   Orbax checkpoints (relpos.checkpoints); damaged_checkpoints/ the ones
                        training set aside
  eval/                 eval.py's translations and scores
"""
import atexit
import functools
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from types import ModuleType
from typing import Any, TextIO

import jax
import numpy as np
from jax.sharding import Mesh

from relpos.data import pipeline

CONFIG_FILE = "config.json"
IMPORTS_FILE = "imports.json"
LOCK_FILE = "train.lock"
METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
CHECKPOINT_DIR = "checkpoints"
DAMAGED_DIR = "damaged_checkpoints"  # where training moves damaged checkpoints (never deleted)
EVAL_DIR = "eval"
DATA_AXIS = "data"

_IMPORTED: list[str] = []  # what `import_modules` imported in this process, in order
# Lines that C++ code prints straight to stdout, past Python's logging, and that say nothing to
# a user: Gloo's on connecting the processes of a CPU run ("[Gloo] Rank 0 is connected to 1
# peer ranks. ...", several per process, mixed into the progress bar and the JSON result).
NOISE_LINE_PREFIXES = (b"[Gloo] Rank ",)


# The source tree relpos runs from (where `relpos` and `configs` are imported from).
SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@functools.cache
def source_commit() -> str:
  """The source tree's short commit, with `-dirty` when it has uncommitted changes to tracked
  files; "unknown" outside a git checkout.

  Read once per process (programs read it at start-up, `cli.start`): the code a process runs is
  the code it loaded then, whatever the tree holds later.
  """
  try:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=SOURCE_ROOT, check=True,
                          capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                           cwd=SOURCE_ROOT, check=True, capture_output=True,
                           text=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown"
  return head + ("-dirty" if dirty else "")


def initialize_distributed(multihost: str) -> None:
  """Joins a multi-process run (every process runs the same command) when `multihost` is set.

  Args:
    multihost: "" (one process: nothing to do); "auto" (the coordinator, process count and
      id are detected on Cloud TPU, SLURM, Open MPI and Kubernetes); or
      "<coordinator host:port>,<num_processes>,<process_id>". With several processes the
      lines of NOISE_LINE_PREFIXES are dropped from stdout and stderr (`LineFilter`).

  Raises:
    ValueError: a malformed `multihost`.
  """
  if not multihost:
    return
  parts = multihost.split(",")
  if multihost != "auto" and (len(parts) != 3 or not parts[1].isdigit()
                              or not parts[2].isdigit()):
    raise ValueError(f"--multihost={multihost!r}: must be 'auto' or "
                     "'<host:port>,<num_processes>,<process_id>'.")
  for stream in (sys.stdout, sys.stderr):
    LineFilter(stream, NOISE_LINE_PREFIXES)
  if multihost == "auto":
    jax.distributed.initialize()
  else:
    jax.distributed.initialize(parts[0], num_processes=int(parts[1]), process_id=int(parts[2]))


def drop_lines(data: bytes, held: bytes, at_line_start: bool,
               prefixes: Sequence[bytes]) -> tuple[bytes, bytes, bool]:
  """One step of a stream filter that drops whole lines starting with one of `prefixes`.

  Args:
    data: the bytes just written.
    held: the bytes the previous step held back (b"" at first).
    at_line_start: whether `held + data` starts a line (True at first).
    prefixes: the starts of the lines to drop.

  Returns:
    (the bytes to pass on now; the bytes to hold back: the start of a line that is, or may
    still become, a dropped one; whether what comes next starts a line). Everything else
    passes at once, so a progress bar redrawn with "\r" is not delayed.
  """
  text, out, start = held + data, bytearray(), 0
  while start < len(text):
    end = text.find(b"\n", start)
    line = text[start:] if end < 0 else text[start:end + 1]
    if at_line_start and end < 0 and any(line.startswith(p) or p.startswith(line)
                                         for p in prefixes):
      return bytes(out), line, True
    if not (at_line_start and any(line.startswith(p) for p in prefixes)):
      out += line
    at_line_start = end >= 0
    start += len(line)
  return bytes(out), b"", at_line_start


class LineFilter:
  """Drops, from everything written to a stream's file descriptor (by C++ code too), the lines
  that start with one of `prefixes`: the descriptor becomes a pipe that a thread copies to the
  original through `drop_lines`. At exit the original is put back and the pipe drained."""

  def __init__(self, stream: TextIO, prefixes: Sequence[bytes]):
    self._stream = stream
    self._fd = stream.fileno()
    self._prefixes = tuple(prefixes)
    stream.flush()
    self._original = os.dup(self._fd)
    read_end, write_end = os.pipe()
    os.dup2(write_end, self._fd)
    os.close(write_end)
    self._read_end = read_end
    self._thread = threading.Thread(target=self._copy, name="line-filter", daemon=True)
    self._thread.start()
    atexit.register(self.close)

  def _copy(self) -> None:
    held, at_line_start = b"", True
    while data := os.read(self._read_end, 1 << 16):
      out, held, at_line_start = drop_lines(data, held, at_line_start, self._prefixes)
      if out:
        os.write(self._original, out)
    if held and not any(held.startswith(p) for p in self._prefixes):
      os.write(self._original, held)  # an unended line at exit that was not a dropped one
    os.close(self._read_end)

  def close(self) -> None:
    """Puts the original descriptor back and waits for the pipe to drain."""
    if not self._stream.closed:
      self._stream.flush()
    os.dup2(self._original, self._fd)  # closes the pipe's write end: the thread sees its end
    self._thread.join(timeout=5)


def make_mesh() -> Mesh:
  """A 1-D mesh over every device of every process, axis DATA_AXIS (batch rows split over it)."""
  return Mesh(np.asarray(jax.devices()), (DATA_AXIS,))


def process_rows(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """This process's contiguous share of the rows of a batch that every process holds whole."""
  return pipeline.shard_rows(batch, jax.process_index(), jax.process_count())


def _is_file(spec: str) -> bool:
  return spec.endswith(".py") or os.sep in spec


def _import_file(path: str) -> ModuleType:
  """Imports a .py file as a module named after it (importable again by that name)."""
  name = os.path.splitext(os.path.basename(path))[0]
  if name in sys.modules and getattr(sys.modules[name], "__file__", None) == path:
    return sys.modules[name]
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  try:
    spec.loader.exec_module(module)
  except BaseException:
    del sys.modules[name]
    raise
  return module


def _origin(spec: str) -> str | None:
  """The file a module spec would run (a .py path, or the module's file), without running it."""
  if _is_file(spec):
    return os.path.abspath(spec)
  try:
    found = importlib.util.find_spec(spec)
  except (ImportError, ValueError):
    return None
  return None if found is None else found.origin


def _exit_words(code: Any) -> str:
  """How a module's `sys.exit(code)` is told: "exited with status 3", or with its message."""
  if code is None or isinstance(code, int):
    return f"exited with status {code or 0}"
  return f"exited ({code})"


def import_modules(specs: Sequence[str], *, refuse_under: str | None = None) -> None:
  """Imports the user's modules (a module name, or a path to a .py file), e.g. a position
  variant's, and records them for `imported`.

  Args:
    specs: what --import gave, in order.
    refuse_under: a folder whose code must never run (a workdir being evaluated).

  Raises:
    ValueError: a module that cannot be found or imported, exits (`sys.exit`) while imported,
      or lies under `refuse_under`, naming it.
  """
  for spec in specs:
    origin = _origin(spec)
    if origin is None or (_is_file(spec) and not os.path.isfile(origin)):
      raise ValueError(f"--import={spec}: no such module or .py file (a module must be "
                       f"importable: on PYTHONPATH, or give the path of its .py file).")
    if refuse_under is not None and os.path.commonpath(
        [os.path.realpath(origin), os.path.realpath(refuse_under)]) == os.path.realpath(
            refuse_under):
      raise ValueError(f"--import={spec}: {origin} lies inside the workdir {refuse_under}; "
                       f"code found in a workdir is never run.")
    try:
      if _is_file(spec):
        _import_file(origin)
      else:
        importlib.import_module(spec)
    except SystemExit as e:  # sys.exit() in the user's module: not a silent end of the program
      raise ValueError(f"--import={spec} {_exit_words(e.code)} while being imported.") from None
    except Exception as e:  # the user's code: any error is theirs, named in one line
      raise ValueError(f"--import={spec}: importing it failed: {type(e).__name__}: {e}") from e
    recorded = origin if _is_file(spec) else spec
    if recorded not in _IMPORTED:
      _IMPORTED.append(recorded)


def imported() -> list[str]:
  """What `import_modules` imported in this process: module names and absolute .py paths."""
  return list(_IMPORTED)


def write_text(path: str, text: str) -> None:
  """Writes `text` (UTF-8) to `path` whole or not at all (a temporary file renamed), so that a
  reader never sees half of it and a failed write leaves the old file."""
  try:
    with open(path + ".tmp", "w", encoding="utf-8") as f:
      f.write(text)
    os.replace(path + ".tmp", path)
  finally:
    if os.path.exists(path + ".tmp"):
      os.remove(path + ".tmp")


def write_json(path: str, data: Any, **dump_options: Any) -> None:
  """Writes `data` as JSON to `path` whole or not at all (`write_text`); `dump_options` go to
  `json.dumps` (indent, sort_keys)."""
  write_text(path, json.dumps(data, **dump_options))


def read_json(path: str) -> Any:
  """The JSON data in `path`.

  Raises:
    ValueError: naming the file, when it is not whole JSON.
  """
  with open(path, encoding="utf-8") as f:
    try:
      return json.load(f)
    except ValueError as e:
      raise ValueError(f"{path} is not valid JSON ({e}).") from None


def write_imports(workdir: str) -> None:
  """Records `imported()` as `workdir/imports.json` (process 0; nothing when empty), so that
  evaluation imports the same modules."""
  if jax.process_index() != 0 or not _IMPORTED:
    return
  write_json(os.path.join(workdir, IMPORTS_FILE), _IMPORTED, indent=2)


def import_recorded(workdir: str) -> None:
  """Imports the modules a run recorded in `workdir/imports.json` (none without the file),
  refusing any that lies inside the workdir.

  Raises:
    ValueError: the file is not a JSON list of strings, or a module fails (naming it).
  """
  path = os.path.join(workdir, IMPORTS_FILE)
  if not os.path.exists(path):
    return
  specs = read_json(path)
  if not (isinstance(specs, list) and all(isinstance(s, str) for s in specs)):
    raise ValueError(f"{path} must hold a JSON list of module names or .py paths.")
  try:
    import_modules(specs, refuse_under=workdir)
  except ValueError as e:
    raise ValueError(f"{path}: {e}") from None
