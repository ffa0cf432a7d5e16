"""Reliability of training (issue 7): exact resume after SIGKILL, SIGTERM, atomic checkpoints,
the non-finite guard, and errors that name the culprit with nothing written or lost; one run
per workdir."""
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from configs import tiny
from relpos import checkpoints
from relpos import evaluate
from relpos import locks
from relpos import metrics_writer
from relpos import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN_PY = os.path.join(ROOT, "train.py")
# The run every kill test restarts: 30 steps, a checkpoint every 4, metrics every step.
KILL_RUN = {"train.num_steps": 30, "train.checkpoint_every_steps": 4, "train.log_every_steps": 1,
            "train.eval_every_steps": 30, "train.keep_checkpoints": 3,
            "decode.validation_bleu": False}
# Kills the process in the middle of its second checkpoint write (after the arrays, before
# the iterator state are written to the step's temporary folder).
KILL_IN_SECOND_SAVE = """
import os, runpy, signal, sys
from grain._src.python.checkpoint import handler
save, calls = handler.CheckpointHandler.save, []
def killing_save(self, *args, **kwargs):
  calls.append(1)
  if len(calls) == 2:
    os.kill(os.getpid(), signal.SIGKILL)
  return save(self, *args, **kwargs)
handler.CheckpointHandler.save = killing_save
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return str(tmp_path_factory.getbasetemp() / "relpos_data")


@pytest.fixture(scope="module")
def environment(tmp_path_factory):
  """Environment of the training processes: JAX's persistent compilation cache shared between
  them (each process would otherwise compile the same steps again)."""
  return {**os.environ, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
          "JAX_COMPILATION_CACHE_DIR": str(tmp_path_factory.mktemp("jax_cache"))}


def make_config(data_dir: str, overrides: dict):
  config = tiny.get_config()
  config.task.tfds_data_dir = data_dir
  for path, value in overrides.items():
    section, name = path.split(".")
    config[section][name] = value
  return config


def train_command(workdir: str, data_dir: str, overrides: dict) -> list[str]:
  flags = [f"--config.{path}={value}" for path, value in overrides.items()]
  return [sys.executable, TRAIN_PY, f"--config={ROOT}/configs/tiny.py", f"--workdir={workdir}",
          f"--config.task.tfds_data_dir={data_dir}", *flags]


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
  strip = lambda records: [{k: v for k, v in r.items() if k != "steps_per_second"}
                           for r in records]
  assert strip(metrics_writer.read_metrics(workdir)) == strip(
      metrics_writer.read_metrics(reference))


def max_logged_step(workdir: str) -> int:
  return max((r["step"] for r in metrics_writer.read_metrics(workdir)), default=0)


@pytest.fixture(scope="module")
def reference(data_dir, tmp_path_factory):
  """Workdir of the uninterrupted KILL_RUN."""
  workdir = str(tmp_path_factory.mktemp("reference"))
  train.train_and_evaluate(make_config(data_dir, KILL_RUN), workdir)
  return workdir


def test_sigkill_at_random_points_then_restart_is_bitwise_exact(reference, data_dir, environment,
                                                               tmp_path):
  workdir, rng = str(tmp_path / "run"), random.Random(7)
  command = train_command(workdir, data_dir, KILL_RUN)
  for _ in range(3):
    # Kill a few steps past whatever earlier processes logged (so past this one's resume).
    target = max_logged_step(workdir) + rng.randint(1, 6)
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env=environment)
    while max_logged_step(workdir) < target and process.poll() is None:
      time.sleep(0.005)
    process.send_signal(signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL, "the run finished before it could be killed"
    with open(os.path.join(workdir, locks.LOCK_FILE), encoding="utf-8") as f:
      assert f.read().startswith(f"process {process.pid} on host ")  # a stale lock: no obstacle
  done = subprocess.run(command, capture_output=True, text=True, check=False, env=environment)
  assert done.returncode == 0, done.stderr[-3000:]
  assert_same_run(workdir, reference)


def test_kill_during_checkpoint_write_keeps_previous_checkpoint(reference, data_dir, environment,
                                                                tmp_path):
  workdir = str(tmp_path / "run")
  command = train_command(workdir, data_dir, KILL_RUN)
  killed = subprocess.run([sys.executable, "-c", KILL_IN_SECOND_SAVE, *command[1:]],
                          capture_output=True, text=True, check=False, env=environment)
  assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
  entries = os.listdir(checkpoints.checkpoint_dir(workdir))
  assert "4" in entries and "8" not in entries
  assert any(e.startswith("8.orbax-checkpoint-tmp") for e in entries)  # the interrupted write
  state, _ = saved(workdir)
  assert int(state["step"]) == 4
  done = subprocess.run(command, capture_output=True, text=True, check=False, env=environment)
  assert done.returncode == 0, done.stderr[-3000:]
  assert not any("tmp" in e for e in os.listdir(checkpoints.checkpoint_dir(workdir)))
  assert_same_run(workdir, reference)


def test_sigterm_saves_and_exits_zero(data_dir, environment, tmp_path):
  workdir = str(tmp_path / "run")
  overrides = {**KILL_RUN, "train.num_steps": 100_000, "train.checkpoint_every_steps": 100_000}
  process = subprocess.Popen(train_command(workdir, data_dir, overrides), stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, env=environment)
  while max_logged_step(workdir) < 5:
    assert process.poll() is None
    time.sleep(0.01)
  process.send_signal(signal.SIGTERM)
  start = time.monotonic()
  stdout, _ = process.communicate(timeout=60)
  assert process.returncode == 0 and time.monotonic() - start < 10
  result = json.loads(stdout.strip().splitlines()[-1])
  assert result["preempted"] and result["step"] >= 5
  state, _ = saved(workdir)
  assert int(state["step"]) == result["step"] == max_logged_step(workdir)


@pytest.mark.parametrize("mode", ["raise", "skip"])
def test_nonfinite_loss(mode, data_dir, tmp_path, monkeypatch):
  """Step 3's batch holds a token id past the vocabulary: NaN embeddings, loss and gradient."""
  global_batch, calls = train.Steps.global_batch, []

  def poisoned(self, batch):
    calls.append(1)
    if len(calls) == 3:
      batch = {**batch, "inputs": np.where(batch["inputs"] > 0, 10**6, 0).astype(np.int32)}
    return global_batch(self, batch)

  monkeypatch.setattr(train.Steps, "global_batch", poisoned)
  overrides = {"train.num_steps": 5, "train.checkpoint_every_steps": 1, "train.log_every_steps": 1,
               "train.eval_every_steps": 5, "train.keep_checkpoints": 10,
               "train.nonfinite": mode, "decode.validation_bleu": False}
  workdir = str(tmp_path)
  if mode == "raise":
    with pytest.raises(train.NonFiniteError, match="non-finite loss or gradient at step 3 .*"
                                                   "the last good checkpoint is step 2"):
      train.train_and_evaluate(make_config(data_dir, overrides), workdir)
    state, _ = saved(workdir)
    assert int(state["step"]) == 2
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(state["params"]))
    return
  result = train.train_and_evaluate(make_config(data_dir, overrides), workdir)
  records = [r for r in metrics_writer.read_metrics(workdir) if r["split"] == "train"]
  assert [r["skipped_updates"] for r in records] == [0, 0, 1, 1, 1]
  assert np.isfinite(result["train"]["loss"]) and np.isfinite(result["validation"]["loss"])
  (before, _), (after, _) = saved(workdir, 2), saved(workdir, 3)
  jax.tree.map(np.testing.assert_array_equal, after["params"], before["params"])
  jax.tree.map(np.testing.assert_array_equal, after["opt_state"], before["opt_state"])
  assert int(after["num_skipped"]) == 1


def test_other_architecture_names_first_differing_parameter(reference, data_dir, tmp_path):
  workdir = str(tmp_path / "run")
  shutil.copytree(reference, workdir)
  before = {p: os.path.getmtime(p) for p in (os.path.join(workdir, "config.json"),
                                             checkpoints.checkpoint_dir(workdir))}
  listing = sorted(os.listdir(checkpoints.checkpoint_dir(workdir)))
  config = make_config(data_dir, {**KILL_RUN, "model.max_relative_position": 8})
  message = (r"parameter decoder/layers/0/self_attention/relative_tables/rel_key has shape "
             r"\(9, 8\) but the config builds \(17, 8\)")
  with pytest.raises(ValueError, match=message):
    train.train_and_evaluate(config, workdir)
  assert {p: os.path.getmtime(p) for p in before} == before
  assert sorted(os.listdir(checkpoints.checkpoint_dir(workdir))) == listing
  with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
    edited = json.load(f)
  edited["model"]["max_relative_position"] = 8
  with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as f:
    json.dump(edited, f)
  with pytest.raises(ValueError, match=message):
    evaluate.evaluate_checkpoint(workdir, split="validation")


def test_cli_bad_config_value_writes_nothing(data_dir, tmp_path):
  workdir = str(tmp_path / "run")
  done = subprocess.run(train_command(workdir, data_dir, {"train.nonfinite": "ignore"}),
                        capture_output=True, text=True, check=False)
  assert done.returncode == 1
  assert ("error: config field train.nonfinite='ignore' is invalid: must be one of 'raise', "
          "'skip'") in done.stderr
  assert not os.path.exists(workdir)


def test_second_run_on_a_workdir_stops_naming_the_first(data_dir, tmp_path):
  workdir = str(tmp_path / "run")
  os.makedirs(workdir)
  with locks.hold(workdir):
    with pytest.raises(locks.WorkdirInUseError,
                       match=f"workdir {workdir} is in use by process {os.getpid()} on host "):
      train.train_and_evaluate(make_config(data_dir, KILL_RUN), workdir)
    done = subprocess.run(train_command(workdir, data_dir, KILL_RUN), capture_output=True,
                          text=True, check=False)
  assert done.returncode == 1
  assert done.stderr.strip().splitlines()[-1].startswith(
      f"error: workdir {workdir} is in use by process {os.getpid()} on host ")
  assert "Traceback" not in done.stderr
  assert sorted(os.listdir(workdir)) == [locks.LOCK_FILE]  # the second run wrote nothing
