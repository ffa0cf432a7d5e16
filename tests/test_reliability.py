"""Reliability of training (issue 7): exact resume after SIGKILL, SIGTERM, atomic checkpoints,
the non-finite guard, and errors that name the culprit with nothing written or lost; one run
per workdir, damaged checkpoints, checkpoints moved between device layouts, and two processes
training as one."""
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
from relpos import device_mesh
from relpos import run_config
from relpos import evaluate
from relpos import locks
from relpos import recorder
from relpos import metrics_writer
from relpos import model as model_lib
from relpos import steps as steps_lib
from relpos import train
from relpos import workdir_files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN_PY = os.path.join(ROOT, "train.py")
# The run every kill test restarts: 30 steps, a checkpoint every 4, metrics every step.
KILL_RUN = {
    "train.num_steps": 30, "train.checkpoint_every_steps": 4, "train.log_every_steps": 1,
    "train.eval_every_steps": 30, "train.keep_checkpoints": 3, "decode.validation_bleu": False
}
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

# The disk fills up while the checkpoint of step 4 is written: the write of its state's
# _METADATA (in Orbax's background save) fails as a full disk's does.
DISK_FULL_AT_STEP_4 = """
import runpy, sys
from orbax.checkpoint._src.path import async_path
write_text = async_path.write_text
async def full_disk(path, text):
  if "/4." in str(path) and str(path).endswith("_METADATA"):
    raise OSError(28, "No space left on device", str(path))
  return await write_text(path, text)
async_path.write_text = full_disk
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
  return {
      **os.environ, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
      "JAX_COMPILATION_CACHE_DIR": str(tmp_path_factory.mktemp("jax_cache"))
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
    with open(os.path.join(workdir, workdir_files.LOCK_FILE), encoding="utf-8") as f:
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


def test_full_disk_during_a_save_is_one_line_naming_the_step(data_dir, environment, tmp_path):
  """Was three of Orbax's tracebacks, then the error of the file, naming no step."""
  workdir = str(tmp_path / "run")
  overrides = {**KILL_RUN, "train.num_steps": 6, "train.checkpoint_every_steps": 2}
  command = train_command(workdir, data_dir, overrides)
  done = subprocess.run([sys.executable, "-c", DISK_FULL_AT_STEP_4, *command[1:]],
                        capture_output=True, text=True, check=False, env=environment)
  folder = checkpoints.checkpoint_dir(workdir)
  assert done.returncode == 1
  assert "Traceback" not in done.stderr and "Save Finalize" not in done.stderr, (
      done.stderr[-3000:])
  assert done.stderr.strip().splitlines()[-1] == (
      f"error: saving the checkpoint of step 4 in {folder} failed: [Errno 28] No space left on "
      f"device: '{folder}/4.orbax-checkpoint-tmp/state.orbax-checkpoint-tmp/_METADATA'; the "
      "last complete checkpoint is step 2: make room (or fix the folder) and run the same "
      "command again to resume.")
  state, _ = saved(workdir)
  assert int(state["step"]) == 2


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_or_sigint_saves_and_exits(signum, data_dir, environment, tmp_path):
  workdir = str(tmp_path / "run")
  overrides = {**KILL_RUN, "train.num_steps": 100_000, "train.checkpoint_every_steps": 100_000}
  process = subprocess.Popen(train_command(workdir, data_dir, overrides), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=environment)
  while max_logged_step(workdir) < 5:
    assert process.poll() is None
    time.sleep(0.01)
  process.send_signal(signum)
  start = time.monotonic()
  stdout, stderr = process.communicate(timeout=60)
  assert time.monotonic() - start < 10
  state, _ = saved(workdir)
  step = int(state["step"])
  assert step == max_logged_step(workdir) and step >= 5
  if signum == signal.SIGTERM:
    assert process.returncode == 0
    result = json.loads(stdout.strip().splitlines()[-1])
    assert result["preempted"] and result["step"] == step
  else:
    assert process.returncode == 130 and "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1] == (
        f"interrupted: saved step {step} to {checkpoints.checkpoint_dir(workdir)}; run the same "
        "command again to resume.")


def strict_records(workdir: str) -> list[dict]:
  """metrics.jsonl read as strict JSON (NaN or Infinity in it fail the test)."""
  def reject(constant):
    raise AssertionError(f"metrics.jsonl holds {constant}")

  with open(os.path.join(workdir, workdir_files.METRICS_FILE), encoding="utf-8") as f:
    return [json.loads(line, parse_constant=reject) for line in f]


@pytest.mark.parametrize("mode", ["raise", "skip", "skip_too_many"])
def test_nonfinite_loss(mode, data_dir, tmp_path, monkeypatch):
  """Step 3's batch holds a token id past the vocabulary: NaN embeddings, loss and gradient."""
  global_batch, calls = steps_lib.Steps.global_batch, []

  def poisoned(self, batch):
    calls.append(1)
    if len(calls) == 3:
      batch = {**batch, "inputs": np.where(batch["inputs"] > 0, 10**6, 0).astype(np.int32)}
    return global_batch(self, batch)

  monkeypatch.setattr(steps_lib.Steps, "global_batch", poisoned)
  overrides = {
      "train.num_steps": 5, "train.checkpoint_every_steps": 1, "train.log_every_steps": 1,
      "train.eval_every_steps": 5, "train.keep_checkpoints": 10,
      "train.nonfinite": "raise" if mode == "raise" else "skip",
      "train.max_skipped_fraction": 0.01 if mode == "skip_too_many" else 0.2,
      "decode.validation_bleu": False
  }
  workdir = str(tmp_path)
  if mode != "skip":
    message = {
        "raise": r"non-finite loss, gradient or parameters at step 3 \(.*\), not saved; "
                 r"the last checkpoint is step 2\. Set train.nonfinite='skip'",
        "skip_too_many": r"updates skipped for non-finite values: 1 by step 3, more than "
                         r"train.max_skipped_fraction=0.01 of the run's 5 steps \(step 3: "
                         r"loss=nan, .*\); the last checkpoint is step 2"
    }[mode]
    with pytest.raises(recorder.NonFiniteError, match=message):
      train.train_and_evaluate(make_config(data_dir, overrides), workdir)
    state, _ = saved(workdir)
    assert int(state["step"]) == 2
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(state["params"]))
    return
  result = train.train_and_evaluate(make_config(data_dir, overrides), workdir)
  records = [r for r in strict_records(workdir) if r["split"] == "train"]
  assert [r["skipped_updates"] for r in records] == [0, 0, 1, 1, 1]
  # No finite step in the third interval.
  assert records[2]["smoothed_loss"] is None and records[2]["grad_norm"] is None
  assert np.isfinite(result["train"]["smoothed_loss"]) and np.isfinite(result["validation"]["loss"])
  (before, _), (after, _) = saved(workdir, 2), saved(workdir, 3)
  jax.tree.map(np.testing.assert_array_equal, after["params"], before["params"])
  jax.tree.map(np.testing.assert_array_equal, after["opt_state"], before["opt_state"])
  assert int(after["num_skipped"]) == 1


def test_exploded_update_is_not_a_good_step(data_dir, tmp_path):
  """A learning rate of 1e30: step 1's loss and gradient are finite, the parameters it makes
  are not (their norm overflows float32)."""
  overrides = {
      "train.num_steps": 3, "train.checkpoint_every_steps": 1, "train.learning_rate": 1e30,
      "decode.validation_bleu": False
  }
  with pytest.raises(
      recorder.NonFiniteError, match=(
          r"non-finite loss, gradient or parameters at step 1 \(loss=\d+\.\d+, grad_norm=\d+\.\d+, "
          r"param_norm=inf\), not saved; no checkpoint was saved yet\.")):
    train.train_and_evaluate(make_config(data_dir, overrides), str(tmp_path))
  assert not os.listdir(checkpoints.checkpoint_dir(str(tmp_path)))


def test_other_architecture_names_first_differing_parameter(reference, data_dir, tmp_path):
  workdir = str(tmp_path / "run")
  shutil.copytree(reference, workdir)
  before = {
      p: os.path.getmtime(p)
      for p in (os.path.join(workdir, "config.json"), checkpoints.checkpoint_dir(workdir))
  }
  listing = sorted(os.listdir(checkpoints.checkpoint_dir(workdir)))
  os.remove(os.path.join(workdir, "config.json"))  # nothing to compare the config with
  config = make_config(data_dir, {**KILL_RUN, "model.max_relative_position": 8})
  message = (r"parameter decoder/layers/0/self_attention/position/rel_key has shape "
             r"\(9, 8\) but the config builds \(17, 8\)")
  with pytest.raises(ValueError, match=message):
    train.train_and_evaluate(config, workdir)
  assert not os.path.exists(os.path.join(workdir, "config.json"))
  assert {p: os.path.getmtime(p) for p in before if os.path.exists(p)
         } == {p: t for p, t in before.items() if os.path.exists(p)}
  assert sorted(os.listdir(checkpoints.checkpoint_dir(workdir))) == listing
  shutil.copy(os.path.join(reference, "config.json"), workdir)
  with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
    edited = json.load(f)
  edited["model"]["max_relative_position"] = 8
  with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as f:
    json.dump(edited, f)
  with pytest.raises(ValueError, match=message):
    evaluate.evaluate_checkpoint(workdir, split="validation")


@pytest.mark.parametrize("field, value, before", [("spm_model_type", "bpe", "unigram"),
                                                  ("vocab_size", 128, 64)])
def test_resuming_with_another_tokenizer_stops(field, value, before, reference, data_dir, tmp_path):
  workdir = str(tmp_path / "run")
  shutil.copytree(reference, workdir)
  config = make_config(data_dir, {**KILL_RUN, f"task.{field}": value})
  with pytest.raises(
      ValueError, match=(
          rf"config field task.{field}={value!r} differs from the {before!r} that the checkpoints "
          rf"in {workdir} were trained with \({workdir}/config.json\): the tokenizer would change"
      )):
    train.train_and_evaluate(config, workdir)
  with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
    assert json.load(f)["task"][field] == before


def test_resuming_with_another_position_variant_stops(reference, data_dir, tmp_path):
  """12 steps without positions and 4 with RoPE would be one checkpoint of no model."""
  workdir = str(tmp_path / "run")
  shutil.copytree(reference, workdir)
  listing = sorted(os.listdir(checkpoints.checkpoint_dir(workdir)))
  config = make_config(data_dir, {**KILL_RUN, "model.position": "rope", "train.num_steps": 34})
  with pytest.raises(
      ValueError, match=
      (rf"^config field model.position='rope' differs from the 'relative' that the checkpoints "
       rf"in {workdir} were trained with \({workdir}/config.json\): the model would change "
       rf"under its parameters. Resume with model.position='relative' or train in a new --workdir.$"
      )):
    train.train_and_evaluate(config, workdir)
  with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
    assert json.load(f)["model"]["position"] == "relative"
  assert sorted(os.listdir(checkpoints.checkpoint_dir(workdir))) == listing


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
  assert sorted(os.listdir(workdir)) == [workdir_files.LOCK_FILE]  # the second run wrote nothing


def test_evaluating_a_training_workdir_reads_only_complete_checkpoints(
    reference, data_dir, tmp_path, caplog):
  workdir = str(tmp_path / "run")
  os.makedirs(workdir)
  shutil.copy(os.path.join(reference, "config.json"), workdir)  # a run that has just started
  config = make_config(data_dir, KILL_RUN)
  with pytest.raises(FileNotFoundError, match=f"no checkpoint is ready in {workdir}/checkpoints"):
    evaluate.restore_model(workdir, run_config.validate(config), "latest", device_mesh.make_mesh())
  shutil.rmtree(workdir)
  shutil.copytree(reference, workdir)
  manager = checkpoints.make_manager(workdir, read_only=True)
  model_config = run_config.validate(config).model
  sharding = jax.sharding.NamedSharding(device_mesh.make_mesh(), jax.sharding.PartitionSpec())

  def restore_while_training(step):  # the run removes the newest one as it is about to be read
    if step == 30:
      shutil.rmtree(os.path.join(checkpoints.checkpoint_dir(workdir), "30"))
    return checkpoints.restore_model(manager, step, model_config, sharding)

  step, _, damaged = checkpoints.restore_newest(manager, restore_while_training)
  manager.close()
  assert (step, damaged) == (28, [])
  assert "damaged" not in caplog.text  # a vanished checkpoint is no damage
  assert (f"Checkpoint {workdir}/checkpoints/30 was deleted while it was read (by the run "
          "training there); trying the one before it.") in caplog.text


def _damage(kind: str, step_dir: str) -> str:
  """Damages the checkpoint in `step_dir` in one of the ways a full disk or a partial copy
  does; returns the words the warning must hold."""
  if kind == "truncated_metadata":
    with open(os.path.join(step_dir, "state", "_METADATA"), "r+b") as f:
      f.truncate(100)
    return "state/_METADATA is not valid JSON"
  if kind == "missing_array_files":
    shutil.rmtree(os.path.join(step_dir, "state", "ocdbt.process_0", "d"))
    return "reading it failed: "
  if kind == "empty_iterator_state":
    open(os.path.join(step_dir, "data", "process_0-of-1.json"), "w").close()
    return "data/process_0-of-1.json is empty"
  shutil.rmtree(step_dir)  # an empty step folder
  os.mkdir(step_dir)
  return "state/_METADATA is missing"


def damaged_copy(reference: str, workdir: str, kind: str) -> tuple[str, str]:
  """A copy of the reference run whose newest checkpoint (30) is damaged: (its folder, the
  words naming the damage)."""
  shutil.copytree(reference, workdir)
  newest = os.path.join(checkpoints.checkpoint_dir(workdir), "30")
  return newest, _damage(kind, newest)


@pytest.mark.parametrize(
    "kind",
    ["truncated_metadata", "missing_array_files", "empty_iterator_state", "empty_step_folder"])
def test_training_resumes_from_the_checkpoint_before_a_damaged_one(kind, reference, data_dir,
                                                                   tmp_path, caplog):
  workdir = str(tmp_path / "run")
  newest, problem = damaged_copy(reference, workdir, kind)
  train.train_and_evaluate(make_config(data_dir, KILL_RUN), workdir)  # trains 29 and 30 again
  assert f"checkpoint {newest} is damaged: {problem}" in caplog.text
  assert "Resuming from step 28" in caplog.text
  set_aside = os.listdir(os.path.join(workdir, workdir_files.DAMAGED_DIR))
  assert len(set_aside) == 1 and set_aside[0].startswith("30.")
  assert_same_run(workdir, reference)


@pytest.mark.parametrize("kind", ["truncated_metadata", "missing_array_files", "empty_step_folder"])
def test_evaluating_latest_skips_a_damaged_checkpoint(kind, reference, data_dir, tmp_path, caplog):
  workdir = str(tmp_path / "run")
  newest, problem = damaged_copy(reference, workdir, kind)
  config = make_config(data_dir, KILL_RUN)
  validated = run_config.validate(config)
  _, step = evaluate.restore_model(workdir, validated, "latest", device_mesh.make_mesh())
  assert step == 28
  assert f"checkpoint {newest} is damaged: {problem}" in caplog.text
  assert "Evaluating step 28: the newer checkpoints [30] are damaged" in caplog.text
  with pytest.raises(checkpoints.DamagedCheckpointError, match=f"{newest} is damaged: {problem}"):
    evaluate.restore_model(workdir, validated, 30, device_mesh.make_mesh())
  assert os.path.isdir(newest)  # evaluation moves nothing


def test_every_checkpoint_damaged_stops_naming_each(reference, data_dir, tmp_path):
  workdir = str(tmp_path / "run")
  shutil.copytree(reference, workdir)
  for step in (24, 28, 30):
    _damage("empty_iterator_state", os.path.join(checkpoints.checkpoint_dir(workdir), str(step)))
  message = "no checkpoint in .* can be restored: " + " ".join(
      rf"checkpoint {workdir}/checkpoints/{step} is damaged: data/process_0-of-1.json is empty\."
      for step in (30, 28, 24))
  with pytest.raises(checkpoints.DamagedCheckpointError, match=message):
    train.train_and_evaluate(make_config(data_dir, KILL_RUN), workdir)
  assert sorted(os.listdir(checkpoints.checkpoint_dir(workdir))) == ["24", "28", "30"]


def test_resuming_with_another_process_count_says_how_many(reference, data_dir, tmp_path):
  workdir = str(tmp_path / "run")
  shutil.copytree(reference, workdir)
  for step in (24, 28, 30):  # as if written by 2 processes
    data = os.path.join(checkpoints.checkpoint_dir(workdir), str(step), "data")
    first, second = (os.path.join(data, f"process_{i}-of-2.json") for i in (0, 1))
    os.rename(os.path.join(data, "process_0-of-1.json"), first)
    shutil.copy(first, second)
  with pytest.raises(
      ValueError, match=r"checkpoint .*/30 was written by 2 processes and this run "
      r"has 1: .* resume with 2 processes"):
    train.train_and_evaluate(make_config(data_dir, KILL_RUN), workdir)


# Run on 1 device: scores the reference run's checkpoint (trained on 4), resumes it from step 28,
# and trains another run for 8 steps, for the test to resume and score on 4 devices.
ON_ONE_DEVICE = """
import json, shutil, sys
import jax, numpy as np
sys.path.insert(0, sys.argv[1])
from tests import test_reliability as t
from relpos import device_mesh, evaluate, run_config, train
from relpos import model as model_lib
data_dir, reference, resumed, fresh = sys.argv[2:]
config = t.make_config(data_dir, t.KILL_RUN)
model, step = evaluate.restore_model(reference, run_config.validate(config), "latest",
                                     device_mesh.make_mesh())
params = jax.tree.map(lambda x: np.asarray(x).tolist(), model_lib.split_model(model)[1])
train.train_and_evaluate(config, resumed)
config.train.num_steps = 8
train.train_and_evaluate(config, fresh)
print(json.dumps({"devices": jax.device_count(), "step": step, "params": params}))
"""


def test_checkpoints_move_between_one_and_four_devices(reference, data_dir, environment, tmp_path):
  assert jax.device_count() == 4
  resumed, fresh = str(tmp_path / "resumed"), str(tmp_path / "fresh")
  shutil.copytree(reference, resumed)
  shutil.rmtree(os.path.join(checkpoints.checkpoint_dir(resumed), "30"))
  done = subprocess.run(
      [sys.executable, "-c", ON_ONE_DEVICE, ROOT, data_dir, reference, resumed, fresh],
      capture_output=True, text=True, check=False,
      env={**environment, "XLA_FLAGS": "--xla_force_host_platform_device_count=1"})
  assert done.returncode == 0, done.stderr[-3000:]
  on_one = json.loads(done.stdout.strip().splitlines()[-1])
  expected = checkpoints.read_state(reference)
  assert on_one["devices"] == 1 and on_one["step"] == 30
  assert on_one["params"] == jax.tree.map(lambda x: x.tolist(), expected["params"])  # bitwise
  # Resumed on 1 device from a 4-device checkpoint: the same run up to float rounding.
  resumed_state = checkpoints.read_state(resumed)
  assert int(resumed_state["step"]) == 30
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
               resumed_state["params"], expected["params"])
  # Trained on 1 device, scored and resumed on 4.
  config = make_config(data_dir, KILL_RUN)
  model, step = evaluate.restore_model(fresh, run_config.validate(config), "latest",
                                       device_mesh.make_mesh())
  assert step == 8
  for param in jax.tree.leaves(model_lib.split_model(model)[1]):
    assert len(param.sharding.device_set) == 4
  train.train_and_evaluate(make_config(data_dir, {**KILL_RUN, "train.num_steps": 12}), fresh)
  losses = lambda workdir: [
      r["smoothed_loss"]
      for r in metrics_writer.read_metrics(workdir)
      if r["split"] == "train" and r["step"] <= 12
  ]
  np.testing.assert_allclose(losses(fresh), losses(reference), rtol=1e-4)


# Unpacked batches (length buckets) with dropout: what a process takes of each global batch
# decides its rows' dropout masks, so only contiguous rows make two processes train as one.
TWO_PROCESS_RUN = {
    "task.packing": False, "train.num_steps": 4, "train.checkpoint_every_steps": 2,
    "train.log_every_steps": 1, "train.eval_every_steps": 100, "decode.validation_bleu": False
}
# One of two processes (2 devices each): trains 2 steps, resumes to 4, then scores the
# validation split of a run that translates (conftest's translating_run) greedily.
IN_TWO_PROCESSES = """
import json, sys
sys.path.insert(0, sys.argv[1])
from tests import test_reliability as t
from relpos import distributed, evaluate, train
data_dir, workdir, translating, output_dir, multihost = sys.argv[2:]
distributed.initialize(multihost)
config = t.make_config(data_dir, {**t.TWO_PROCESS_RUN, "train.num_steps": 2})
train.train_and_evaluate(config, workdir)
train.train_and_evaluate(t.make_config(data_dir, t.TWO_PROCESS_RUN), workdir)
result = evaluate.evaluate_checkpoint(translating, split="validation", beam_size=1,
                                      output_dir=output_dir)
print(json.dumps(result))
"""


def _in_two_processes(data_dir: str, workdir: str, translating: str, output_dir: str,
                      environment: dict[str, str]) -> list[str]:
  """The stdout of each of two processes running IN_TWO_PROCESSES on `workdir`. Gloo gives up
  connecting after 30 s, which a loaded machine can exceed: that failure is retried once, in a
  fresh workdir on another port."""
  for attempt in (1, 2):
    address = f"localhost:{random.randrange(20000, 40000)}"
    processes = [
        subprocess.Popen(
            [
                sys.executable, "-c", IN_TWO_PROCESSES, ROOT, data_dir, workdir, translating,
                output_dir, f"{address},2,{index}"
            ], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**environment, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
        for index in range(2)
    ]
    outputs = [process.communicate(timeout=240) for process in processes]
    failed = [stderr for process, (_, stderr) in zip(processes, outputs) if process.returncode]
    if not failed:
      # Gloo's connection lines are filtered at the source (relpos.line_filter.LineFilter).
      assert not any("[Gloo] Rank" in stdout + stderr for stdout, stderr in outputs)
      return [stdout for stdout, _ in outputs]
    if attempt == 2 or not any("Gloo" in stderr or "timed out" in stderr for stderr in failed):
      raise AssertionError(failed[0][-3000:])
    shutil.rmtree(workdir, ignore_errors=True)


def test_two_processes_train_resume_and_evaluate_as_one(data_dir, environment, translating_run,
                                                        tmp_path):
  workdir, reference = str(tmp_path / "two"), str(tmp_path / "one")
  train.train_and_evaluate(make_config(data_dir, TWO_PROCESS_RUN), reference)  # 4 devices
  translating = translating_run[1]
  expected = evaluate.evaluate_checkpoint(translating, split="validation", beam_size=1,
                                          output_dir=str(tmp_path / "eval_one"))
  assert expected["bleu"] > 3.0  # translations to compare, not empty lines
  outputs = _in_two_processes(data_dir, workdir, translating, str(tmp_path / "eval_two"),
                              environment)
  results = [json.loads(stdout.strip().splitlines()[-1]) for stdout in outputs]
  assert sorted(os.listdir(os.path.join(checkpoints.checkpoint_dir(workdir), "4", "data"))) == [
      "commit_success.txt", "process_0-of-2.json", "process_1-of-2.json"
  ]
  losses = lambda run: [(r["step"], r["smoothed_loss"])
                        for r in metrics_writer.read_metrics(run)
                        if r["split"] == "train"]
  assert [step for step, _ in losses(workdir)] == [1, 2, 3, 4]
  np.testing.assert_allclose(losses(workdir), losses(reference), rtol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
               checkpoints.read_state(workdir)["params"],
               checkpoints.read_state(reference)["params"])
  for result in results:
    assert result["step"] == expected["step"] == 400
    assert result["bleu"] == expected["bleu"] and result["chrf"] == expected["chrf"]
  with open(results[0]["translations_file"],
            encoding="utf-8") as f, open(expected["translations_file"], encoding="utf-8") as g:
    translations = f.read()
    assert translations == g.read()
  assert translations.count("\n") == 16 and "\n\n" not in translations  # none empty
