"""Start-up shared by the command-line programs (train.py, eval.py, relpos.experiments.run)."""
from absl import flags
from absl import logging

from relpos import evaluate


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
