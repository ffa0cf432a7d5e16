"""Joining a multi-process run (`--multihost`): every process runs the same command."""
import re
import sys
from collections.abc import Callable

import jax
import numpy as np
from jax.experimental import multihost_utils

from relpos import line_filter

# Lines that C++ code prints straight to stdout, past Python's logging, and that say nothing to
# a user: Gloo's on connecting the processes of a CPU run ("[Gloo] Rank 0 is connected to 1
# peer ranks. ...", several per process, mixed into the progress bar and the JSON result).
NOISE_LINE_PREFIXES = (b"[Gloo] Rank ",)

_FORMAT = "'auto' or '<host:port>,<num_processes>,<process_id>'"
# host:port,num_processes,process_id; the host may hold colons itself ([::1]:1234).
_SPEC = re.compile(r"([^,\s]+):(\d+),(\d+),(\d+)")


def _coordinator(multihost: str) -> tuple[str, int, int] | None:
  """(coordinator address, number of processes, this process's id) of `multihost`; None for
  'auto'.

  Raises:
    ValueError: a malformed `multihost`, a port outside 1-65535, no processes, or a process
      id not below the number of processes, naming it.
  """
  if multihost == "auto":
    return None
  match = _SPEC.fullmatch(multihost)
  if not match:
    raise ValueError(f"--multihost={multihost!r}: must be {_FORMAT}.")
  host, port, count, process = match.group(1), *map(int, match.groups()[1:])
  if not 0 < port < 65536:
    raise ValueError(f"--multihost={multihost!r}: the port {port} is not in 1-65535.")
  if count == 0:
    raise ValueError(f"--multihost={multihost!r}: the number of processes must be at least 1.")
  if process >= count:
    raise ValueError(f"--multihost={multihost!r}: the process id {process} must be below the "
                     f"number of processes {count}.")
  return f"{host}:{port}", count, process


def initialize(multihost: str) -> None:
  """Joins a multi-process run (every process runs the same command) when `multihost` is set.

  Args:
    multihost: "" (one process: nothing to do); "auto" (the coordinator, process count and
      id are detected on Cloud TPU, SLURM, Open MPI and Kubernetes); or
      "<coordinator host:port>,<num_processes>,<process_id>". With several processes the
      lines of NOISE_LINE_PREFIXES are dropped from stdout and stderr
      (`line_filter.LineFilter`).

  Raises:
    ValueError: a malformed `multihost`, or joining failed (JAX's reason, on one line, after
      the flag: with 'auto' outside a cluster JAX finds no coordinator).
  """
  if not multihost:
    return
  coordinator = _coordinator(multihost)
  for stream in (sys.stdout, sys.stderr):
    line_filter.LineFilter(stream, NOISE_LINE_PREFIXES)
  try:
    if coordinator is None:
      jax.distributed.initialize()
    else:
      address, count, process = coordinator
      jax.distributed.initialize(address, num_processes=count, process_id=process)
  except (ValueError, RuntimeError) as e:  # RuntimeError: jax.errors.JaxRuntimeError
    cause = (str(e).strip().splitlines() or [type(e).__name__])[0]
    where = (" (no TPU, SLURM, Open MPI or Kubernetes cluster found)"
             if coordinator is None and "coordinator_address" in cause else "")
    raise ValueError(f"--multihost={multihost!r}{where}: {cause}") from None


def from_process_0(value: int) -> int:
  """`value` as process 0 has it, on every process (each process's own with one)."""
  if jax.process_count() == 1:
    return value
  return int(multihost_utils.broadcast_one_to_all(np.int32(value)))


def on_process_0(work: Callable[[], None], what: str) -> None:
  """Runs `work` on process 0 alone (a check or a change of shared files) and tells every
  process whether it raised, so that they stop together: a process going on alone would wait
  in its next collective for ever. Process 0 raises its own error; the others RuntimeError
  naming `what`.
  """
  error = None
  if jax.process_index() == 0:
    try:
      work()
    except Exception as e:  # pylint: disable=broad-exception-caught  # raised below, on all
      error = e
  failed = bool(from_process_0(int(error is not None)))
  if error is not None:
    raise error
  if failed:
    raise RuntimeError(f"{what} failed on process 0 (its log says why).")
