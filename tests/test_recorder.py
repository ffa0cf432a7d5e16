"""The loop's bookkeeping: train metrics on the host, the validation history, early stopping's
count, and what a resumed run reads back."""
import json
import os

import ml_collections
import numpy as np
import pytest
import tqdm

from relpos import metrics_writer
from relpos import recorder
from relpos import workdir_files

TRAIN = {
    "nonfinite": "skip", "max_skipped_fraction": 0.25, "num_steps": 8, "learning_rate": 0.002,
    "warmup_steps": 4
}


def make_recorder(workdir, first_step=0, num_skipped=0, **train_fields):
  config = ml_collections.ConfigDict({**TRAIN, **train_fields})
  progress = tqdm.tqdm(total=config.num_steps, initial=first_step, disable=True)
  return recorder.Recorder(str(workdir), config, first_step, num_skipped, progress, lambda: None,
                           started=0.0)


def step_metrics(loss, finite=True):
  return {
      "loss": np.float32(loss), "grad_norm": np.float32(2 * loss), "param_norm": np.float32(1.0),
      "finite": np.float32(1.0 if finite else 0.0)
  }


def test_evaluations_since_best():
  assert recorder.evaluations_since_best([]) == 0
  assert recorder.evaluations_since_best([{"bleu": 1.0}, {"bleu": 3.0}, {"bleu": 2.0}]) == 1
  assert recorder.evaluations_since_best([{"loss": 3.0}, {"loss": 2.0}, {"loss": 2.5},
                                          {"loss": 2.1}]) == 2


def test_checkpoint_metrics_keep_what_the_best_checkpoint_is_ranked_by():
  assert recorder.checkpoint_metrics(None) is None
  assert recorder.checkpoint_metrics({"bleu": 30.0, "loss": 2.0, "chrf": 50.0,
                                      "time_s": 3.0}) == {"bleu": 30.0, "loss": 2.0}
  assert recorder.checkpoint_metrics({"loss": 2.0, "accuracy": 0.5}) == {"loss": 2.0}


def test_train_summary_means_the_finite_steps_and_names_the_schedule(tmp_path):
  records = make_recorder(tmp_path)
  records.push(1, step_metrics(4.0))
  records.push(2, step_metrics(float("nan"), finite=False))
  records.push(3, step_metrics(2.0))
  summary = records.train_summary(num_skipped=1, applied_updates=2)
  assert summary["smoothed_loss"] == pytest.approx(3.0)
  assert summary["grad_norm"] == pytest.approx(6.0)
  assert summary["skipped_updates"] == 1
  # The next update is the 3rd applied one: lr(2) = 0.002 * min(3 / 4, sqrt(4 / 3)).
  assert summary["learning_rate"] == pytest.approx(0.002 * 0.75)
  assert records.last["train"] is summary
  # The sums start again after a summary; every step skipped gives None, not a division by 0.
  records.push(4, step_metrics(float("inf"), finite=False))
  assert records.train_summary(num_skipped=2, applied_updates=2)["smoothed_loss"] is None


def test_a_float16_overflow_step_leaves_grad_norm_finite(tmp_path):
  """A loss-scale overflow is a finite step (the scale halves, nothing is skipped) whose
  gradient norm is infinite: the interval's mean is of the other steps, not inf (null)."""
  records = make_recorder(tmp_path)
  records.push(1, step_metrics(4.0) | {"grad_norm": np.float32(np.inf)})
  records.push(2, step_metrics(2.0))
  summary = records.train_summary(num_skipped=0, applied_updates=2)
  assert summary["smoothed_loss"] == pytest.approx(3.0)
  assert summary["grad_norm"] == pytest.approx(4.0)


def test_too_many_skipped_updates_raise_naming_the_field(tmp_path):
  records = make_recorder(tmp_path)  # at most 0.25 * 8 = 2 skipped
  for step in (1, 2, 3):
    records.push(step, step_metrics(float("nan"), finite=False))
  with pytest.raises(recorder.NonFiniteError, match="train.max_skipped_fraction=0.25"):
    records.flush()


def test_raise_mode_stops_at_the_first_non_finite_step(tmp_path):
  records = make_recorder(tmp_path, nonfinite="raise")
  records.push(1, step_metrics(1.0))
  records.push(2, step_metrics(float("nan"), finite=False))
  with pytest.raises(recorder.NonFiniteError, match="at step 2 .*no checkpoint was saved yet"):
    records.flush()


def test_a_resumed_run_reads_its_history_up_to_its_step(tmp_path):
  lines = [
      {"step": 2, "split": "train", "smoothed_loss": 3.0, "elapsed_s": 10.0},
      {"step": 2, "split": "validation", "loss": 2.5, "time_s": 4.0},
      {"step": 4, "split": "train", "smoothed_loss": 2.0, "elapsed_s": 20.0},
      {"step": 4, "split": "validation", "loss": 2.0, "time_s": 4.0},
      # past the checkpoint the run resumes from: not part of its history
      {"step": 6, "split": "validation", "loss": 1.0, "time_s": 4.0},
  ]
  with open(os.path.join(tmp_path, workdir_files.METRICS_FILE), "w") as f:
    f.writelines(json.dumps(line) + "\n" for line in lines)
  records = make_recorder(tmp_path, first_step=4)
  assert [v["loss"] for v in records.validation] == [2.5, 2.0]
  assert records.last == {
      "train": {"smoothed_loss": 2.0, "elapsed_s": 20.0},
      "validation": {"loss": 2.0, "time_s": 4.0}
  }
  records.add_validation({"loss": 2.2})
  assert recorder.evaluations_since_best(records.validation) == 1
  # The run's seconds continue from those of its earlier starts (20 s of training + 4 s of
  # validation by step 4).
  assert metrics_writer.elapsed_seconds(lines[:4]) == 24.0
  assert records.train_summary(num_skipped=0, applied_updates=5)["elapsed_s"] >= 24.0
