"""One training run per workdir: a lock held for the life of the run.

The lock is `fcntl.flock` on `<workdir>/train.lock`. The operating system releases it when the
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
import socket
import time
from collections.abc import Iterator

import jax
import numpy as np
from jax.experimental import multihost_utils

from relpos import runtime



class WorkdirInUseError(RuntimeError):
  """Another live process trains in the workdir."""


def _try_lock(path: str):
  """The open, locked file at `path` and None, or None and what the file says of its holder."""
  handle = open(path, "a+", encoding="utf-8")
  try:
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    handle.seek(0)
    holder = handle.read().strip()
    handle.close()
    return None, holder or "a process that has not written its name yet"
  handle.truncate(0)
  handle.write(f"process {os.getpid()} on host {socket.gethostname()}, started "
               f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n")
  handle.flush()
  return handle, None


@contextlib.contextmanager
def hold(workdir: str) -> Iterator[None]:
  """Holds the lock of `workdir` (an existing folder) for the duration of the block.

  Raises:
    WorkdirInUseError: naming the workdir and the process holding it.
  """
  handle, holder = None, None
  if jax.process_index() == 0:
    handle, holder = _try_lock(os.path.join(workdir, runtime.LOCK_FILE))
  busy = holder is not None
  if jax.process_count() > 1:
    busy = bool(multihost_utils.broadcast_one_to_all(np.int32(busy)))
  if busy:
    raise WorkdirInUseError(
        f"workdir {workdir} is in use by {holder or 'the process 0 of another run'}: wait for "
        "that run to end (or stop it) before resuming, or pass another --workdir.")
  try:
    yield
  finally:
    if handle is not None:
      handle.close()  # releases the lock; the file stays (removing it would race a new run)
