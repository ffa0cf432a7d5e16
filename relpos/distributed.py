"""Joining a multi-process run (`--multihost`): every process runs the same command."""
import sys

import jax

from relpos import line_filter

# Lines that C++ code prints straight to stdout, past Python's logging, and that say nothing to
# a user: Gloo's on connecting the processes of a CPU run ("[Gloo] Rank 0 is connected to 1
# peer ranks. ...", several per process, mixed into the progress bar and the JSON result).
NOISE_LINE_PREFIXES = (b"[Gloo] Rank ",)


def initialize(multihost: str) -> None:
  """Joins a multi-process run (every process runs the same command) when `multihost` is set.

  Args:
    multihost: "" (one process: nothing to do); "auto" (the coordinator, process count and
      id are detected on Cloud TPU, SLURM, Open MPI and Kubernetes); or
      "<coordinator host:port>,<num_processes>,<process_id>". With several processes the
      lines of NOISE_LINE_PREFIXES are dropped from stdout and stderr
      (`line_filter.LineFilter`).

  Raises:
    ValueError: a malformed `multihost`.
  """
  if not multihost:
    return
  parts = multihost.split(",")
  if multihost != "auto" and (len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit()):
    raise ValueError(f"--multihost={multihost!r}: must be 'auto' or "
                     "'<host:port>,<num_processes>,<process_id>'.")
  for stream in (sys.stdout, sys.stderr):
    line_filter.LineFilter(stream, NOISE_LINE_PREFIXES)
  if multihost == "auto":
    jax.distributed.initialize()
  else:
    jax.distributed.initialize(parts[0], num_processes=int(parts[1]), process_id=int(parts[2]))
