"""One process per folder: a lock held for the life of a training run (`<workdir>/train.lock`),
of a table's run (`run.lock`, waited for) or of a whole table (`<output_dir>/table.lock`).

The lock is `fcntl.flock` on the file. The operating system releases it when the
holding process ends, however it ends (SIGKILL, a crash), so a lock file left by a dead run
never blocks a restart; the file only records who held it last (pid, host, start time) for the
message a second run gets. On several processes only process 0 takes the lock (on its host;
the other processes of the same run must not compete with it), and every process learns from
it whether the workdir is free, so a second multi-process run stops on every host at once.
flock works across hosts on NFSv4 and Lustre, not on every network filesystem.
"""
import contextlib
import fcntl
import os
import re
import socket
import time
from collections.abc import Iterator

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from relpos import workdir_files

# Linux's table of the file locks held now ("1: FLOCK  ADVISORY  WRITE <pid> <dev>:<inode> ..."):
# where it exists, whether a lock is held is read there, without taking it.
PROC_LOCKS = "/proc/locks"


class WorkdirInUseError(RuntimeError):
  """Another live process trains in the workdir."""


# What a lock file records of the process holding it, written when it takes the lock.
_HOLDER_LINE = "process {pid} on host {host}, started {time}"
_HOLDER_PID_AND_HOST = re.compile(r"process (\d+) on host (\S+),")
_UNNAMED_HOLDER = "a process that has not written its name yet"


def _record_holder(handle) -> None:
  """Writes this process into the lock file `handle`, which it has just locked."""
  handle.truncate(0)
  handle.write(
      _HOLDER_LINE.format(pid=os.getpid(), host=socket.gethostname(), time=time.strftime(
          "%Y-%m-%d %H:%M:%S")) + "\n")
  handle.flush()


def _try_lock(path: str):
  """The open, locked file at `path` and None, or None and what the file says of its holder."""
  handle = open(path, "a+", encoding="utf-8")
  try:
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    handle.seek(0)
    recorded = handle.read().strip()
    handle.close()
    return None, recorded or _UNNAMED_HOLDER
  _record_holder(handle)
  return handle, None


def _locked_inodes() -> set[int] | None:
  """The inodes of the files flock-ed now by any process (PROC_LOCKS; locks waited for are not
  held), or None where the system has no PROC_LOCKS. Inodes alone: an overlay filesystem reports
  another device number there than os.stat does."""
  try:
    with open(PROC_LOCKS, encoding="utf-8") as f:
      lines = f.read().splitlines()
  except OSError:
    return None
  inodes = set()
  for line in lines:
    match = re.search(r" FLOCK .* [0-9a-f]+:[0-9a-f]+:(\d+) ", line)
    if match and "->" not in line.split():
      inodes.add(int(match.group(1)))
  return inodes


def _recorded_process_alive(recorded: str) -> bool:
  """Whether the process a lock file records (`_HOLDER_LINE`) runs on this host now (the fallback
  where there is no PROC_LOCKS)."""
  match = _HOLDER_PID_AND_HOST.match(recorded)
  if not match or match.group(2) != socket.gethostname():
    return False
  try:
    os.kill(int(match.group(1)), 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True  # alive, another user's
  return True


def holder(folder: str, lock_file: str = workdir_files.LOCK_FILE) -> str | None:
  """Who holds the lock `folder/lock_file` now, as the file records it ("process <pid> on host
  <host>, started <time>"), or None when no process holds it. Read without taking the lock:
  taking it, even for an instant, could refuse a run starting then."""
  path = os.path.join(folder, lock_file)
  try:
    with open(path, encoding="utf-8") as f:
      recorded = f.read().strip()
    inode = os.stat(path).st_ino
  except FileNotFoundError:
    return None
  locked = _locked_inodes()
  held = inode in locked if locked is not None else _recorded_process_alive(recorded)
  return (recorded or _UNNAMED_HOLDER) if held else None


@contextlib.contextmanager
def hold(
    folder: str, *, lock_file: str = workdir_files.LOCK_FILE, wait: bool = False,
    what: str = "workdir",
    busy: str = "wait for that run to end (or stop it) before resuming, or pass another "
    "--workdir"
) -> Iterator[None]:
  """Holds the lock `folder/lock_file` (in an existing folder) for the duration of the block.

  Args:
    folder: a run's workdir, or a table's output folder.
    lock_file: the lock's file name in `folder` (`workdir_files.LOCK_FILE` for training).
    wait: wait while another process holds it (logging who), instead of raising.
    what: what `folder` is, for the error ("workdir", "output folder").
    busy: what the error tells the user to do when the lock is held.

  Raises:
    WorkdirInUseError: (not `wait`) naming the folder, the process holding it and `busy`.
  """
  path = os.path.join(folder, lock_file)
  handle, held_by = None, None
  if jax.process_index() == 0:
    handle, held_by = _try_lock(path)
    if held_by is not None and wait:
      logging.warning("Waiting for %s, which holds %s, to end.", held_by, path)
      handle = open(path, "a+", encoding="utf-8")  # pylint: disable=consider-using-with
      fcntl.flock(handle, fcntl.LOCK_EX)
      _record_holder(handle)
      held_by = None
  taken = held_by is None
  if jax.process_count() > 1:
    taken = not multihost_utils.broadcast_one_to_all(np.int32(not taken))
  if not taken:
    raise WorkdirInUseError(
        f"{what} {folder} is in use by {held_by or 'the process 0 of another run'}: {busy}.")
  try:
    yield
  finally:
    if handle is not None:
      handle.close()  # releases the lock; the file stays (removing it would race a new run)
