"""Tests for relpos.checkpoint_data: a checkpoint's data position restores only into a run of
as many processes and of the same data pipeline, each named in one line."""
import json
import os

import pytest

from relpos import checkpoint_data


class _Iterator:
  """A data iterator that only says its position."""
  def __init__(self, state):
    self.state = state

  def get_state(self):
    return self.state


def test_a_data_position_of_another_pipeline_is_named_not_damage(tmp_path):
  """Packed and length-bucketed iterators save positions of other forms: resuming one from the
  other raised a KeyError inside grain, which a checkpoint read reports as damage (and would set
  every healthy checkpoint aside)."""
  packed = {"parent": {"next_index": 22}, "next_row": 0, "counter": 8}
  os.makedirs(tmp_path / "data")
  (tmp_path / "data" / checkpoint_data.data_file()).write_text(json.dumps(packed))
  checkpoint_data.check_data_position(str(tmp_path), _Iterator({**packed, "counter": 0}))
  bucketed = {"parent": {"next_index": 0}, "next_index_in_buffer": 1}
  with pytest.raises(
      ValueError, match=(
          rf"^checkpoint {tmp_path}: its data position is of another data pipeline \(it has "
          r"'counter', which this run's data iterator lacks\): task.packing, or relpos.data, "
          r"changed since it was saved; resume with the settings and commit it was saved with, or "
          r"train in a new --workdir.$")):
    checkpoint_data.check_data_position(str(tmp_path), _Iterator(bucketed))
  with pytest.raises(ValueError, match="it lacks 'next_index_in_buffer', which this run's"):
    checkpoint_data.check_data_position(str(tmp_path), _Iterator({**packed, **bucketed}))


def test_another_process_count_says_how_many_to_resume_with(tmp_path):
  os.makedirs(tmp_path / "data")
  for index in range(2):
    (tmp_path / "data" / f"process_{index}-of-2.json").write_text("{}")
  with pytest.raises(
      ValueError, match=(rf"^checkpoint {tmp_path} was written by 2 processes and "
                         r"this run has 1: .* so resume with 2 processes")):
    checkpoint_data.check_process_count(str(tmp_path))
  checkpoint_data.check_process_count(str(tmp_path / "none"))  # no data: nothing to compare
