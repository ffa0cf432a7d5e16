"""Tests for relpos.experiments.single_run: what a run's result reads from its metrics (the
training and evaluation of a whole run: tests/test_experiments_runner.py)."""
import json

import pytest

from relpos import checkpoint_damage
from relpos import workdir_files
from relpos.experiments import single_run


def test_validation_curve_and_training_speed_from_the_metrics(tmp_path):
  records = [
      {"step": 2, "split": "train", "steps_per_second": 4.0},
      {"step": 2, "split": "validation", "bleu": 1.0},
      {"step": 4, "split": "train", "steps_per_second": 6.0},
      {"step": 4, "split": "validation", "bleu": 2.0},
      {"step": 2, "split": "validation", "bleu": 1.5},  # logged again after a resume
      {"step": 6, "split": "train", "steps_per_second": None}
  ]
  (tmp_path / workdir_files.METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in records))
  assert single_run.validation_curve(str(tmp_path)) == [[2, 1.5], [4, 2.0]]
  assert single_run.train_steps_per_second(str(tmp_path)) == 5.0


def test_every_dataset_has_its_evaluation_splits():
  assert set(single_run.EVAL_SPLITS) == {"synthetic", "multi30k", "wmt14"}
  assert all(splits for splits in single_run.EVAL_SPLITS.values())


def test_a_stop_during_a_checkpoint_read_is_a_stop_not_damage():
  """SIGTERM during the final evaluation raises StopRequested wherever it lands; in a
  checkpoint read, whose errors become DamagedCheckpointError, it must stay a stop (else a
  healthy checkpoint is reported damaged, or 'latest' falls back to an older one)."""
  with pytest.raises(single_run.StopRequested):
    with checkpoint_damage.reading("checkpoints/30"):
      single_run._raise_stop("SIGTERM")  # pylint: disable=protected-access
