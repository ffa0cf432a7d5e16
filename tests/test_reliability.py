"""Reliability of training (docs/reliability.md): exact resume after SIGKILL, SIGTERM and SIGINT,
atomic checkpoint writes, a full disk, the non-finite guard, resuming with another tokenizer or
position variant refused, one run per workdir, and two processes training as one (checkpoints
that do not fit, damaged or moved between device layouts: tests/test_checkpoints.py)."""
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

from relpos import checkpoints
from relpos import evaluate
from relpos import locks
from relpos import recorder
from relpos import metrics_writer
from relpos import steps as steps_lib
from relpos import train
from relpos import workdir_files
from kill_run import (KILL_RUN, ROOT, TWO_PROCESS_RUN, assert_same_run, make_config,
                      max_logged_step, saved, train_command)

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


# One of two processes (2 devices each): trains 2 steps, resumes to 4, then scores the
# validation split of a run that translates (conftest's translating_run) greedily.
IN_TWO_PROCESSES = """
import json, sys
sys.path.insert(0, sys.argv[1])
from tests import kill_run as t
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
        subprocess.Popen([
            sys.executable, "-c", IN_TWO_PROCESSES, ROOT, data_dir, workdir, translating,
            output_dir, f"{address},2,{index}"
        ], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment)
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


def test_two_processes_train_resume_and_evaluate_as_one(data_dir, environment, xla_flags,
                                                        translating_run, tmp_path):
  workdir, reference = str(tmp_path / "two"), str(tmp_path / "one")
  train.train_and_evaluate(make_config(data_dir, TWO_PROCESS_RUN), reference)  # 4 devices
  translating = translating_run[1]
  expected = evaluate.evaluate_checkpoint(translating, split="validation", beam_size=1,
                                          output_dir=str(tmp_path / "eval_one"))
  assert expected["bleu"] > 3.0  # translations to compare, not empty lines
  outputs = _in_two_processes(data_dir, workdir, translating, str(tmp_path / "eval_two"),
                              {**environment, "XLA_FLAGS": xla_flags(2)})  # 2 devices each
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


def test_ctrl_c_to_one_of_two_processes_saves_both_at_one_step(data_dir, environment, xla_flags,
                                                               tmp_path):
  """SIGINT reaches one process of two (2 devices each): both stop after the step JAX's sync
  point names and save it together, the one with status 130 and "interrupted", the other
  preempted with 0 (a KeyboardInterrupt in one would leave the other waiting in a collective)."""
  workdir = str(tmp_path / "two")
  overrides = {
      **TWO_PROCESS_RUN, "train.num_steps": 100_000, "train.checkpoint_every_steps": 100_000
  }
  environment = {**environment, "XLA_FLAGS": xla_flags(2)}
  for attempt in (1, 2):  # Gloo gives up connecting after 30 s: retried once on another port
    address = f"localhost:{random.randrange(20000, 40000)}"
    logs = [(tmp_path / f"stdout{i}-{attempt}", tmp_path / f"stderr{i}-{attempt}") for i in (0, 1)]
    processes = [
        subprocess.Popen(
            train_command(workdir, data_dir, overrides) + [f"--multihost={address},2,{i}"],
            stdout=out.open("w"), stderr=err.open("w"), env=environment)
        for i, (out, err) in enumerate(logs)
    ]
    try:
      while max_logged_step(workdir) < 3 and all(p.poll() is None for p in processes):
        time.sleep(0.05)
      if max_logged_step(workdir) >= 3:
        processes[0].send_signal(signal.SIGINT)
      codes = [p.wait(timeout=120) for p in processes]
    finally:
      for p in processes:
        p.kill()
    stdout, stderr = ([path.read_text(encoding="utf-8") for path in paths] for paths in zip(*logs))
    if codes != [130, 0] and attempt == 1 and any("Gloo" in e or "timed out" in e for e in stderr):
      shutil.rmtree(workdir, ignore_errors=True)
      continue
    break
  assert codes == [130, 0], stderr[0][-3000:] + stderr[1][-3000:]
  step = int(checkpoints.read_state(workdir)["step"])
  assert step == max_logged_step(workdir) and step >= 3
  assert "Traceback" not in stderr[0] and stderr[0].strip().splitlines()[-1] == (
      f"interrupted: saved step {step} to {checkpoints.checkpoint_dir(workdir)}; run the same "
      "command again to resume.")
  result = json.loads(stdout[1].strip().splitlines()[-1])
  assert result["preempted"] and result["step"] == step
