"""Start-up shared by the command-line programs (train.py, eval.py, relpos.experiments.run)."""
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from absl import app
from absl import flags
from absl import logging

from relpos import evaluate
from relpos import locks
from relpos import train

Result = TypeVar("Result")
# What a user's input or the state of a workdir can cause: one line, no traceback.
USER_ERRORS = (ValueError, FileNotFoundError, locks.WorkdirInUseError, train.NonFiniteError)


def define_multihost_flag() -> flags.FlagHolder:
  """Defines --multihost (see `relpos.evaluate.initialize_distributed`)."""
  return flags.DEFINE_string(
      "multihost", "", "Several processes: 'auto' (TPU, SLURM, MPI, Kubernetes) or "
      "'<coordinator host:port>,<num_processes>,<process_id>'.")


def start(multihost: str = "") -> None:
  """Quiets library INFO logs unless --verbosity was given, then joins a multi-process run.

  Library INFO logs (Orbax, TFDS, absl) would drown the progress bar and the one line per run.

  Raises:
    ValueError: a malformed `multihost`.
  """
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  evaluate.initialize_distributed(multihost)


def run(argv: Sequence[str], work: Callable[[], Result], *, multihost: str = "") -> Result:
  """The body of a program's absl `main`: `start`, then `work()`, whose result it returns.

  Raises:
    app.UsageError: on positional arguments.
    SystemExit: "error: <message>" (status 1) for any of USER_ERRORS, instead of a traceback.
  """
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {list(argv[1:])}")
  try:
    start(multihost)
    return work()
  except USER_ERRORS as e:
    sys.exit(f"error: {e}")
