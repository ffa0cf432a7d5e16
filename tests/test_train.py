"""Training (relpos.train): tiny end-to-end runs, resuming, early stopping, errors before work."""
import json
import os
import re
import shutil
import signal

import jax
import numpy as np
import pytest

from configs import tiny
from relpos import checkpoints
from relpos import device_mesh
from relpos import run_config
from relpos import evaluate
from relpos import metrics_writer
from relpos import train
from relpos.data import pipeline

NUM_STEPS = 12


def tiny_config(data_dir: str, **train_overrides):
  """configs/tiny.py with its data under `data_dir`."""
  config = tiny.get_config()
  config.task.tfds_data_dir = data_dir
  config.train.update(train_overrides)
  return config


@pytest.fixture(scope="module")
def trained(data_dir, tmp_path_factory):
  """(config, workdir, result) of an uninterrupted tiny run of NUM_STEPS steps."""
  config = tiny_config(data_dir, num_steps=NUM_STEPS)
  workdir = str(tmp_path_factory.mktemp("trained"))
  return config, workdir, train.train_and_evaluate(config, workdir)


def test_run_writes_config_metrics_events_and_checkpoints(trained):
  config, workdir, result = trained
  with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
    assert json.load(f) == run_config.validate(config).to_dict()
  records = metrics_writer.read_metrics(workdir)
  train_steps = [r["step"] for r in records if r["split"] == "train"]
  assert train_steps == [2, 4, 6, 8, 10, 12]
  validation = [r for r in records if r["split"] == "validation"]
  assert [r["step"] for r in validation] == [6, 12]
  for record in validation:
    assert record["num_sentences"] == config.task.synthetic.num_validation
    assert 0.0 <= record["accuracy"] <= 1.0 and record["loss"] > 0
    assert record["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
  assert result["step"] == NUM_STEPS and not result["preempted"]
  assert result["validation"] == {
      k: v for k, v in validation[-1].items() if k not in ("step", "split")
  }
  assert all(record["time_s"] > 0 for record in validation)
  assert result["validation_time_s"] == pytest.approx(sum(r["time_s"] for r in validation))
  train_losses = [r["smoothed_loss"] for r in records if r["split"] == "train"]
  assert train_losses[-1] < train_losses[0]
  assert os.listdir(os.path.join(workdir, "tensorboard"))
  manager = checkpoints.make_manager(workdir, read_only=True)
  # The last 2 (8, 12); the best is kept besides (test_early_stopping_after_patience_evaluations:
  # 12 steps translate every sentence empty, BLEU 0.0 at 6 and 12, a tie).
  assert set(manager.all_steps()) - {6} == {8, 12}
  state = checkpoints.read_state(workdir)
  assert int(state["step"]) == NUM_STEPS and int(state["num_skipped"]) == 0


def test_restarted_run_continues_from_its_checkpoint(trained, tmp_path):
  config, workdir, _ = trained
  stopped = str(tmp_path)
  first = train.train_and_evaluate(tiny_config(config.task.tfds_data_dir, num_steps=8), stopped)
  assert first["step"] == 8
  second = train.train_and_evaluate(config, stopped)
  assert second["step"] == NUM_STEPS
  records = metrics_writer.read_metrics(stopped)
  # Steps 1-8 ran once: the restart began at 8, not 0.
  assert [r["step"] for r in records if r["split"] == "train"] == [2, 4, 6, 8, 10, 12]
  expected, resumed = checkpoints.read_state(workdir), checkpoints.read_state(stopped)
  jax.tree.map(np.testing.assert_array_equal, resumed, expected)
  uninterrupted = [r for r in metrics_writer.read_metrics(workdir) if r["split"] == "train"]
  assert metrics_writer.without_timing(uninterrupted) == metrics_writer.without_timing(
      [r for r in records if r["split"] == "train"])
  # config.json names the last start's budget; the starts say what changed, and when.
  starts = metrics_writer.read_starts(stopped)
  assert [(s["step"], s.get("config_changes")) for s in starts
         ] == [(0, None), (8, [{"field": "train.num_steps", "before": 8, "after": NUM_STEPS}])]


def test_resuming_past_the_budget_stops_naming_the_step(trained, tmp_path):
  config, workdir, _ = trained
  copy = str(tmp_path / "run")
  shutil.copytree(workdir, copy)
  config_json = open(os.path.join(copy, "config.json")).read()
  shorter = tiny_config(config.task.tfds_data_dir, num_steps=8)
  with pytest.raises(
      ValueError, match=re.escape(
          f"{copy}/checkpoints holds step {NUM_STEPS}, past train.num_steps=8: resume with "
          f"train.num_steps >= {NUM_STEPS}, or train in a new --workdir.")):
    train.train_and_evaluate(shorter, copy)
  assert open(os.path.join(copy, "config.json")).read() == config_json


def test_resuming_with_another_tokenizer_stops_before_restoring(trained, tmp_path, monkeypatch):
  """Each start records its tokenizer's SHA-256; a resume on another one (another data folder)
  is refused before any checkpoint is read, the workdir unchanged."""
  config, workdir, _ = trained

  def restore_newest(*args, **kwargs):
    raise AssertionError("a checkpoint was read before the tokenizer was checked")

  starts = metrics_writer.read_starts(workdir)
  assert {s["tokenizer_sha256"] for s in starts
         } == {pipeline.get_task(config.task).tokenizer.sha256()}
  filtered = pipeline.get_task(config.task).train_examples()[1]  # what max_length left out
  assert starts[-1]["train_examples"] == {
      "num_examples": filtered.num_examples, "num_overlong": filtered.num_overlong,
      "action": config.task.overlong
  }
  copy = str(tmp_path / "run")
  shutil.copytree(workdir, copy)
  metrics_writer.record_start(copy, NUM_STEPS, "abc1234", tokenizer_sha256="0" * 64)
  before = sorted(os.listdir(copy))
  longer = tiny_config(config.task.tfds_data_dir, num_steps=NUM_STEPS + 4)
  with monkeypatch.context() as patch:
    patch.setattr(checkpoints, "restore_newest", restore_newest)
    with pytest.raises(ValueError, match="is not the one the checkpoints in .* were trained with"):
      train.train_and_evaluate(longer, copy)
  assert sorted(os.listdir(copy)) == before and len(metrics_writer.read_starts(copy)) == 2


def test_a_start_that_saved_no_checkpoint_binds_no_tokenizer(data_dir, tmp_path):
  """A run stopped before its first checkpoint trained nothing on its tokenizer: started again
  on another one (the data folder fixed), it trains."""
  workdir = str(tmp_path / "run")
  os.makedirs(workdir)
  metrics_writer.record_start(workdir, 0, "abc1234", tokenizer_sha256="0" * 64)
  result = train.train_and_evaluate(tiny_config(data_dir, num_steps=2), workdir)
  assert result["step"] == 2
  assert metrics_writer.read_starts(workdir)[-1]["tokenizer_sha256"] != "0" * 64


def test_sigterm_during_the_last_steps_save_is_reported(data_dir, tmp_path, monkeypatch):
  """The loop asks whether to stop before a step's validation and save; a SIGTERM during the
  last one's was saved by them, and is still reported preempted (a table would otherwise go
  on to the run's final evaluation)."""
  save = checkpoints.save

  def save_then_terminated(manager, state, *args, **kwargs):
    save(manager, state, *args, **kwargs)
    if int(state["step"]) == 2:
      os.kill(os.getpid(), signal.SIGTERM)

  monkeypatch.setattr(checkpoints, "save", save_then_terminated)
  result = train.train_and_evaluate(tiny_config(data_dir, num_steps=2), str(tmp_path / "run"))
  assert result["step"] == 2 and result["preempted"]


def test_invalid_config_stops_before_any_work(data_dir, tmp_path):
  workdir = str(tmp_path / "run")
  config = tiny_config(data_dir)
  config.train.nonfinite = "ignore"
  with pytest.raises(
      ValueError, match="config field train.nonfinite='ignore' is invalid: must "
      "be one of 'raise', 'skip'"):
    train.train_and_evaluate(config, workdir)
  config = tiny_config(data_dir, batch_size=6)
  with pytest.raises(
      ValueError, match=r"train.batch_size=6 must be divisible by the number of "
      r"devices \(4\)"):
    train.train_and_evaluate(config, workdir)
  assert not os.path.exists(workdir)
  (tmp_path / "file").write_text("")
  with pytest.raises(ValueError, match=f"workdir {tmp_path}/file exists and is not a folder"):
    train.train_and_evaluate(tiny_config(data_dir), str(tmp_path / "file"))


def test_accumulation_must_divide_the_batch(data_dir, tmp_path):
  config = tiny_config(data_dir, grad_accumulation_steps=3)
  with pytest.raises(
      ValueError, match=r"train\.batch_size=8 must be divisible by "
      r"train\.grad_accumulation_steps=3"):
    train.train_and_evaluate(config, str(tmp_path))


def test_early_stopping_after_patience_evaluations(data_dir, tmp_path, monkeypatch):
  losses = iter([3.0, 2.0, 2.5, 2.4, 1.0])
  monkeypatch.setattr(train, "_validate", lambda *args: {"loss": next(losses)})
  config = tiny_config(data_dir, num_steps=10, eval_every_steps=2, checkpoint_every_steps=2,
                       early_stopping_patience=2)
  result = train.train_and_evaluate(config, str(tmp_path))
  assert result["early_stopped"] and result["step"] == 8
  manager = checkpoints.make_manager(str(tmp_path), read_only=True)
  # The last 2 and the best (the lowest loss, at step 4), which evaluation's "best" restores.
  assert (manager.latest_step(), manager.best_step(), manager.all_steps()) == (8, 4, [4, 6, 8])
  validated = run_config.validate(config)
  assert evaluate.restore_model(str(tmp_path), validated, "best", device_mesh.make_mesh())[1] == 4
  # Started again (its final evaluation interrupted, say), it stays stopped: the next
  # validation, 1.0, would have been its best.
  records = metrics_writer.read_metrics(str(tmp_path))
  again = train.train_and_evaluate(config, str(tmp_path))
  assert again["early_stopped"] and again["step"] == 8
  assert metrics_writer.read_metrics(str(tmp_path)) == records
  assert checkpoints.make_manager(str(tmp_path), read_only=True).all_steps() == [4, 6, 8]


def test_a_damaged_metrics_line_stops_a_resume_naming_it_before_any_write(trained, tmp_path):
  config, workdir, _ = trained
  resumed = str(tmp_path / "run")
  shutil.copytree(workdir, resumed)
  path = os.path.join(resumed, "metrics.jsonl")
  with open(path, encoding="utf-8") as f:
    lines = f.readlines()
  lines[2] = lines[2].replace('"train"', '"tr\x01ain"')  # a byte a failing disk flipped
  with open(path, "w", encoding="utf-8") as f:
    f.writelines(lines)
  config_json = os.path.join(resumed, "config.json")
  os.utime(config_json, (0, 0))
  with pytest.raises(
      ValueError,
      match=(rf"^{path}:3 is not a JSON record \(Invalid control character at: line 1 column \d+ "
             r"\(char \d+\)\): repair or delete that line \(the checkpoints do not need it\)\.$")):
    train.train_and_evaluate(tiny_config(config.task.tfds_data_dir, num_steps=16), resumed)
  assert os.path.getmtime(config_json) == 0


def test_a_checkpoints_file_stops_training_and_evaluation_before_any_step(data_dir, tmp_path):
  workdir = str(tmp_path)
  (tmp_path / "checkpoints").write_text("", encoding="utf-8")
  message = (rf"^{workdir}/checkpoints is a file, not a folder of checkpoints: move it aside or "
             r"pass another --workdir\.$")
  with pytest.raises(ValueError, match=message):
    train.train_and_evaluate(tiny_config(data_dir), workdir)
  assert sorted(os.listdir(workdir)) == ["checkpoints", "train.lock"]
  run_config.write_to(run_config.validate(tiny_config(data_dir)), workdir)
  with pytest.raises(ValueError, match=message):
    evaluate.evaluate_checkpoint(workdir, split="validation")


def test_an_unexpected_error_in_training_stops_the_data_thread(data_dir, tmp_path, monkeypatch):
  """The training iterator prefetches on a thread; one still running when Python exits after an
  error aborts it (status 134, "terminate called without an active exception")."""
  opened_iterators = []
  train_iterator = pipeline.Task.train_iterator

  def recorded(self, *args, **kwargs):
    opened_iterators.append(train_iterator(self, *args, **kwargs))
    return opened_iterators[-1]

  def fails(*args, **kwargs):
    raise RuntimeError("a bug")

  monkeypatch.setattr(pipeline.Task, "train_iterator", recorded)
  monkeypatch.setattr(train, "_train_loop", fails)
  with pytest.raises(RuntimeError, match="a bug"):
    train.train_and_evaluate(tiny_config(data_dir, num_steps=2), str(tmp_path / "run"))
  [iterator] = opened_iterators
  assert iterator._closed  # pylint: disable=protected-access
