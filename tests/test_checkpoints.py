"""Tests for relpos.checkpoints: restoring only checkpoints that fit the config (another
architecture or process count is named in one line, nothing written), damaged checkpoints
skipped, set aside and named, a checkpoint vanishing while read, and checkpoints moved between
device layouts. The run is tests/kill_run.py's (its workdir: the `reference` fixture); a run
saved by an earlier commit (tests/saved_run.py) restores, computes and resumes as it did."""
import functools
import json
import os
import re
import shutil
import subprocess
import sys

import grain
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from relpos import checkpoint_damage
from relpos import checkpoints
from relpos import device_mesh
from relpos import evaluate
from relpos import metrics_writer
from relpos import model as model_lib
from relpos import run_config
from relpos import train
from relpos import variant_trial
from relpos import workdir_files
from kill_run import KILL_RUN, ROOT, assert_same_run, make_config
import saved_run
import test_model


def test_other_architecture_names_first_differing_parameter(reference, data_dir, tmp_path):
  """A config.json edited to another architecture (or model code changed under the
  checkpoints) passes the config comparison; the parameters' shapes stop it, naming the first
  that differs, before anything is written. Without config.json nothing is compared: a resume
  stops at once."""
  workdir = str(tmp_path / "run")
  shutil.copytree(reference, workdir)
  config = make_config(data_dir, {**KILL_RUN, "model.max_relative_position": 8})
  os.remove(os.path.join(workdir, "config.json"))
  with pytest.raises(ValueError, match="config.json is missing, but .* holds checkpoints"):
    train.train_and_evaluate(config, workdir)
  shutil.copy(os.path.join(reference, "config.json"), workdir)
  with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
    edited = json.load(f)
  edited["model"]["max_relative_position"] = 8
  with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as f:
    json.dump(edited, f)
  before = {
      p: os.path.getmtime(p)
      for p in (os.path.join(workdir, "config.json"), checkpoints.checkpoint_dir(workdir))
  }
  listing = sorted(os.listdir(checkpoints.checkpoint_dir(workdir)))
  message = (r"parameter decoder/layers/0/self_attention/position/rel_key has shape "
             r"\(9, 8\) but the config builds \(17, 8\)")
  with pytest.raises(ValueError, match=message):
    train.train_and_evaluate(config, workdir)
  assert {p: os.path.getmtime(p) for p in before} == before
  assert sorted(os.listdir(checkpoints.checkpoint_dir(workdir))) == listing
  with pytest.raises(ValueError, match=message):
    evaluate.evaluate_checkpoint(workdir, split="validation")


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
  if kind == "empty_metrics":  # Orbax reads every checkpoint's as a manager opens
    os.makedirs(os.path.join(step_dir, "metrics"), exist_ok=True)
    open(os.path.join(step_dir, checkpoints.METRICS_FILE), "w").close()
    return "metrics/metrics is empty"
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


@pytest.mark.parametrize("kind", [
    "truncated_metadata", "missing_array_files", "empty_iterator_state", "empty_step_folder",
    "empty_metrics"
])
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


def test_a_fault_of_the_machine_is_not_damage(reference, data_dir, tmp_path, monkeypatch):
  """A timeout reading a network folder says nothing of the checkpoint: it stops the run
  (run again, it resumes), where damage would set the newest checkpoint aside."""
  workdir = str(tmp_path / "run")
  shutil.copytree(reference, workdir)

  def timed_out(*args, **kwargs):
    raise TimeoutError("read of checkpoints/30/state timed out")

  monkeypatch.setattr(checkpoints.ocp.CheckpointManager, "restore", timed_out)
  with pytest.raises(TimeoutError, match="timed out"):
    train.train_and_evaluate(make_config(data_dir, KILL_RUN), workdir)
  assert not os.path.exists(os.path.join(workdir, workdir_files.DAMAGED_DIR))
  assert "30" in os.listdir(checkpoints.checkpoint_dir(workdir))


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
  with pytest.raises(checkpoint_damage.DamagedCheckpointError,
                     match=f"{newest} is damaged: {problem}"):
    evaluate.restore_model(workdir, validated, 30, device_mesh.make_mesh())
  assert os.path.isdir(newest)  # evaluation moves nothing


def test_evaluating_beside_a_damaged_metrics_file_is_refused_naming_it(
    reference, data_dir, tmp_path):
  """Orbax reads every checkpoint's metrics as a manager opens: evaluation, which moves
  nothing, cannot read past one and says which and what sets it aside."""
  workdir = str(tmp_path / "run")
  newest, problem = damaged_copy(reference, workdir, "empty_metrics")
  validated = run_config.validate(make_config(data_dir, KILL_RUN))
  with pytest.raises(
      checkpoint_damage.DamagedCheckpointError,
      match=re.escape(f"checkpoint {newest} is damaged: {problem}: nothing can be "
                      "read from ") + r".* \(train.py on this --workdir sets it aside"):
    evaluate.restore_model(workdir, validated, "latest", device_mesh.make_mesh())
  assert os.path.isdir(newest)


def test_eval_py_past_a_damaged_checkpoint_prints_its_warnings_and_no_traceback(
    reference, environment, tmp_path):
  """The sibling reads Orbax had started printed 2,500 lines ("Exception ignored in: <coroutine
  ...>", "Event loop is closed", each with a tensorstore spec): `cli.drop_failed_read_leftovers`.
  """
  workdir = str(tmp_path / "run")
  newest, _ = damaged_copy(reference, workdir, "missing_array_files")
  done = subprocess.run([
      sys.executable,
      os.path.join(ROOT, "eval.py"), f"--workdir={workdir}", "--split=validation",
      "--checkpoint=latest", "--beam_size=1"
  ], capture_output=True, text=True, check=False, env=environment)
  assert done.returncode == 0, done.stderr[-3000:]
  lines = [
      line for line in done.stderr.replace("\r", "\n").splitlines()
      if line.strip() and "sentence/s" not in line and "without ending: they are cut" not in line
  ]  # the run barely trained: its translations reach the decode budget, which a warning counts
  assert len(lines) == 2, "\n".join(lines)
  assert f"checkpoint {newest} is damaged: reading it failed: " in lines[0]
  assert "Evaluating step 28: the newer checkpoints [30] are damaged." in lines[1]
  assert json.loads(done.stdout)["step"] == 28


def test_every_checkpoint_damaged_stops_naming_each(reference, data_dir, tmp_path):
  workdir = str(tmp_path / "run")
  shutil.copytree(reference, workdir)
  for step in (24, 28, 30):
    _damage("empty_iterator_state", os.path.join(checkpoints.checkpoint_dir(workdir), str(step)))
  message = "no checkpoint in .* can be restored: " + " ".join(
      rf"checkpoint {workdir}/checkpoints/{step} is damaged: data/process_0-of-1.json is empty\."
      for step in (30, 28, 24))
  with pytest.raises(checkpoint_damage.DamagedCheckpointError, match=message):
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
from tests import kill_run as t
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


def test_checkpoints_move_between_one_and_four_devices(reference, data_dir, environment, xla_flags,
                                                       tmp_path):
  assert jax.device_count() == 4
  resumed, fresh = str(tmp_path / "resumed"), str(tmp_path / "fresh")
  shutil.copytree(reference, resumed)
  shutil.rmtree(os.path.join(checkpoints.checkpoint_dir(resumed), "30"))
  done = subprocess.run(
      [sys.executable, "-c", ON_ONE_DEVICE, ROOT, data_dir, reference, resumed, fresh],
      capture_output=True, text=True, check=False, env={**environment, "XLA_FLAGS": xla_flags(1)})
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


def test_a_run_saved_by_an_earlier_commit_restores_computes_and_resumes_as_it_did(
    data_dir, tmp_path):
  workdir = str(tmp_path / "run")
  shutil.copytree(saved_run.FOLDER, workdir, ignore=shutil.ignore_patterns("expected.json"))
  with open(os.path.join(saved_run.FOLDER, "expected.json"), encoding="utf-8") as f:
    expected = json.load(f)
  config = run_config.replace(run_config.load(workdir), {"task.tfds_data_dir": data_dir})
  model, step = evaluate.restore_model(workdir, config, "latest", device_mesh.make_mesh())
  assert step == saved_run.RESTORED_STEP
  np.testing.assert_allclose(saved_run.logits(model), expected["logits"], rtol=1e-4, atol=1e-5)
  assert train.train_and_evaluate(config, workdir)["step"] == saved_run.NUM_STEPS
  resumed = saved_run.train_losses(metrics_writer.read_metrics(workdir), saved_run.RESTORED_STEP)
  assert resumed == pytest.approx(expected["train_loss"], rel=1e-4)
  # The resume is the one recorded start, at the saved step.
  assert [s["step"] for s in metrics_writer.read_starts(workdir)] == [saved_run.RESTORED_STEP]


def test_best_is_the_newest_of_equal_validations(tmp_path):
  """What --checkpoint=best restores and keeps when two validations tie: the newer (Orbax sorts
  by metric, keeping step order, and takes the last), as `--status` names it too."""
  manager = checkpoints.make_manager(str(tmp_path))
  iterator = iter(grain.MapDataset.range(4).to_iter_dataset())
  for step, bleu in ((2, 43.0), (4, 41.5), (6, 43.0)):
    state = {"step": jnp.int32(step), "params": {"w": jnp.zeros(2)}}
    checkpoints.save(manager, state, iterator, metrics={"bleu": bleu, "loss": 1.0})
  checkpoints.wait(manager)
  assert (checkpoints.resolve_step(manager, "best"), manager.all_steps()) == (6, [6])
  manager.close()


@functools.partial(jax.jit, static_argnums=0)
def _eval_logits(graphdef, params, rng):
  """The evaluation logits of variant_trial's pairs, compiled once per model structure."""
  return nnx.merge(graphdef, params, rng)(variant_trial.INPUTS, variant_trial.TARGETS)


def _raw(tree):
  """Leaves as numpy arrays, RNG keys as their raw data."""
  is_key = lambda leaf: jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)
  return [
      np.asarray(jax.random.key_data(leaf) if is_key(leaf) else leaf)
      for leaf in jax.tree.leaves(tree)
  ]


@pytest.mark.parametrize("variant", test_model.VARIANTS)
def test_every_variant_restores_its_saved_model_bitwise(variant, tmp_path):
  """What `checkpoints.save` writes, `restore_model` (the model built from the config, abstract,
  filled from the checkpoint) gives back: the parameters of every variant case (shared
  tables, per-head, learned encodings, FIRE's c and L, ...) and its RNG streams (SHAPE and
  randomized positions draw from them in training) bitwise, hence the same evaluation logits.
  Every parameter is moved off its initial value and every RNG count advanced, so that nothing
  passes by being initialised alike (FIRE's c and L, layer norms, biases start at constants).
  One layer a stack: the variant's parameters and sharing are all there (the tables shared
  across layers are one for both stacks)."""
  config = test_model.make_config(**test_model.VARIANTS[variant], num_encoder_layers=1,
                                  num_decoder_layers=1)
  graphdef, params, rng = model_lib.split_model(model_lib.build_model(config, 0))
  noise = np.random.default_rng(0)
  params = jax.tree.map(lambda p: p + noise.standard_normal(p.shape, np.float32) / 10, params)
  rng = jax.tree_util.tree_map_with_path(
      lambda path, leaf: leaf + 7
      if jax.tree_util.keystr(path).endswith("['count']") else leaf, rng)
  # Committed, as restored arrays are: one compilation of _eval_logits serves both models.
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  params, rng = jax.device_put((params, rng), device)
  manager = checkpoints.make_manager(str(tmp_path))
  checkpoints.save(manager, {"step": jnp.int32(3), "params": params, "rng": rng},
                   iter(grain.MapDataset.range(4).to_iter_dataset()))
  checkpoints.wait(manager)
  manager.close()
  manager = checkpoints.make_manager(str(tmp_path), read_only=True)
  restored = model_lib.split_model(checkpoints.restore_model(manager, 3, config, device))
  manager.close()
  assert restored[0] == graphdef
  for want, got in zip((params, rng), restored[1:]):
    assert jax.tree.structure(got) == jax.tree.structure(want)
    assert all(np.array_equal(a, b) for a, b in zip(_raw(got), _raw(want)))
  np.testing.assert_array_equal(_eval_logits(*restored), _eval_logits(graphdef, params, rng))


class _Manager:
  """A CheckpointManager stand-in: its steps' folders exist under `directory`."""
  def __init__(self, directory, steps):
    self.directory, self.steps = directory, steps
    for step in steps:
      os.makedirs(os.path.join(directory, str(step)))

  def all_steps(self):
    return list(self.steps)

  def reload(self):
    pass


def test_processes_agree_on_the_step_restored(tmp_path, monkeypatch, caplog):
  """Each process reads files of its own (its data position): one whose newest checkpoint is
  whole, where another's is damaged, restores the one before it too, as the other does."""
  manager = _Manager(str(tmp_path), [20, 30])
  monkeypatch.setattr(checkpoints.jax, "process_count", lambda: 2)
  gathered = iter([np.array([1, 0]), np.array([1, 1])])  # step 30 failed on process 1
  monkeypatch.setattr(checkpoints.multihost_utils, "process_allgather",
                      lambda restored: next(gathered))
  monkeypatch.setattr(checkpoints.multihost_utils, "broadcast_one_to_all", lambda step: step)
  step, restored, damaged = checkpoints.restore_newest(manager, lambda s: f"state {s}")
  assert (step, restored, damaged) == (20, "state 20", [30])
  assert f"checkpoint {tmp_path}/30 is damaged on another process." in caplog.text


def test_processes_restore_the_step_process_0_lists(tmp_path, monkeypatch):
  """This process lists step 40, committed by a training run after process 0 listed 30: both
  restore 30, or they would translate with two models."""
  manager = _Manager(str(tmp_path), [20, 30, 40])
  monkeypatch.setattr(checkpoints.jax, "process_count", lambda: 2)
  process_0_chose = iter([30])
  monkeypatch.setattr(checkpoints.multihost_utils, "broadcast_one_to_all",
                      lambda step: np.int32(next(process_0_chose)))
  monkeypatch.setattr(checkpoints.multihost_utils, "process_allgather",
                      lambda restored: np.array([1, 1]))
  assert checkpoints.restore_newest(manager, lambda s: f"state {s}") == (30, "state 30", [])


def test_damage_one_process_finds_stops_every_process_before_orbax_reads(
    reference, data_dir, tmp_path, monkeypatch, caplog):
  """Process 1 finds checkpoint 30's files damaged (its own data position, say); process 0, whose
  files are whole, must not enter Orbax's restore of 30 (its closing barrier, which process 1
  never reaches): both agree first, and both restore 28."""
  workdir = str(tmp_path / "run")
  shutil.copytree(reference, workdir)

  class TwoProcesses:  # as relpos.checkpoints sees jax; Orbax still sees the one process
    process_count = staticmethod(lambda: 2)
    __getattr__ = lambda self, name: getattr(jax, name)

  monkeypatch.setattr(checkpoints, "jax", TwoProcesses())
  gathered = iter([[1, 0], [1, 0], [1, 1], [1, 1]])  # 30: before and after; then 28 alike
  monkeypatch.setattr(checkpoints.multihost_utils, "process_allgather",
                      lambda restored: np.array(next(gathered)))
  read = []
  orbax_restore = checkpoints.ocp.CheckpointManager.restore
  monkeypatch.setattr(
      checkpoints.ocp.CheckpointManager, "restore",
      lambda self, step, **kwargs: read.append(step) or orbax_restore(self, step, **kwargs))
  validated = run_config.validate(make_config(data_dir, KILL_RUN))
  _, step = evaluate.restore_model(workdir, validated, "latest", device_mesh.make_mesh())
  assert (step, read) == (28, [28])
  assert f"checkpoint {checkpoints.checkpoint_dir(workdir)}/30 is damaged on another process" in (
      caplog.text)
