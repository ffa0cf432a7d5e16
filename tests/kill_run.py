"""The runs tests/test_reliability.py and tests/test_checkpoints.py kill, damage and compare:
the tiny config trained 30 steps with a checkpoint every 4 (`KILL_RUN`), as train.py runs it
in a child process or train.train_and_evaluate in this one (its uninterrupted workdir is the
session's `reference` fixture, tests/conftest.py), the same in two processes
(`TWO_PROCESS_RUN`), and how two workdirs compare. Child processes import it as
`tests.kill_run`."""
import os
import sys

import jax
import numpy as np

from configs import tiny
from relpos import checkpoints
from relpos import metrics_writer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN_PY = os.path.join(ROOT, "train.py")
# The run every kill test restarts: 30 steps, a checkpoint every 4, metrics every step.
KILL_RUN = {
    "train.num_steps": 30, "train.checkpoint_every_steps": 4, "train.log_every_steps": 1,
    "train.eval_every_steps": 30, "train.keep_checkpoints": 3, "decode.validation_bleu": False
}

# Two processes (2 devices each) train it unpacked for 4 steps (tests/test_reliability.py).
TWO_PROCESS_RUN = {
    "task.packing": False, "train.num_steps": 4, "train.checkpoint_every_steps": 2,
    "train.log_every_steps": 1, "train.eval_every_steps": 100, "decode.validation_bleu": False
}


def make_config(data_dir: str, overrides: dict):
  config = tiny.get_config()
  config.task.tfds_data_dir = data_dir
  for path, value in overrides.items():
    section, name = path.split(".")
    config[section][name] = value
  return config


def train_command(workdir: str, data_dir: str, overrides: dict) -> list[str]:
  flags = [f"--config.{path}={value}" for path, value in overrides.items()]
  return [
      sys.executable, TRAIN_PY, f"--config={ROOT}/configs/tiny.py", f"--workdir={workdir}",
      f"--config.task.tfds_data_dir={data_dir}", *flags
  ]


def saved(workdir: str, step: int | None = None) -> tuple[dict, str]:
  """(train state, iterator state JSON) of a checkpoint (default the latest)."""
  state = checkpoints.read_state(workdir, step)
  data = os.path.join(checkpoints.checkpoint_dir(workdir), str(int(state["step"])), "data")
  with open(os.path.join(data, "process_0-of-1.json"), encoding="utf-8") as f:
    return state, f.read()


def assert_same_run(workdir: str, reference: str) -> None:
  """Bitwise-equal final state, iterator position and metrics (timings aside)."""
  (state, data), (expected_state, expected_data) = saved(workdir), saved(reference)
  assert int(state["step"]) == int(expected_state["step"])
  jax.tree.map(np.testing.assert_array_equal, state, expected_state)
  assert data == expected_data
  assert metrics_writer.without_timing(
      metrics_writer.read_metrics(workdir)) == (metrics_writer.without_timing(
          metrics_writer.read_metrics(reference)))


def max_logged_step(workdir: str) -> int:
  return max((r["step"] for r in metrics_writer.read_metrics(workdir)), default=0)
