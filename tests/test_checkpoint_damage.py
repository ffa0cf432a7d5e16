"""Tests for relpos.checkpoint_damage: what counts as damage, and the one line a user reads."""
import os

import pytest

from relpos import checkpoint_damage

TENSORSTORE_ERROR = (
    "FAILED_PRECONDITION: Error opening \"zarr3\" driver: Error reading local file "
    "\"/r/checkpoints/30/state/d/abc\": Unexpected end of file [source locations='tensorstore/"
    "driver/kvs_backed_chunk_driver.cc:1262'] [tensorstore_spec='{\"driver\":\"zarr3\"}']\n"
    "Traceback-like second line")


def test_short_cause_keeps_the_file_and_reason_and_drops_the_spec():
  cause = checkpoint_damage.short_cause(RuntimeError(TENSORSTORE_ERROR))
  assert cause == ("FAILED_PRECONDITION: Error opening \"zarr3\" driver: Error reading local file "
                   "\"/r/checkpoints/30/state/d/abc\": Unexpected end of file")


def test_short_cause_cuts_long_messages_and_names_an_empty_one():
  assert checkpoint_damage.short_cause(ValueError("x" * 50), max_chars=10) == "xxxxxxx..."
  assert checkpoint_damage.short_cause(ValueError("x" * 50), max_chars=None) == "x" * 50
  assert checkpoint_damage.short_cause(KeyError()) == "KeyError"


def test_a_failed_read_becomes_damage_naming_the_folder_and_cause():
  with pytest.raises(checkpoint_damage.DamagedCheckpointError) as raised:
    with checkpoint_damage.reading("/r/checkpoints/30"):
      raise RuntimeError(TENSORSTORE_ERROR)
  assert str(raised.value) == ("checkpoint /r/checkpoints/30 is damaged: reading it failed: "
                               "FAILED_PRECONDITION: Error opening \"zarr3\" driver: Error reading "
                               "local file \"/r/checkpoints/30/state/d/abc\": Unexpected end of "
                               "file.")
  assert isinstance(raised.value.__cause__, RuntimeError)


@pytest.mark.parametrize("fault", checkpoint_damage.NOT_DAMAGE + (KeyboardInterrupt,))
def test_a_fault_of_the_machine_or_a_stop_is_not_damage(fault):
  with pytest.raises(fault):
    with checkpoint_damage.reading("/r/checkpoints/30"):
      raise fault("while reading")


def test_json_problem_names_missing_empty_and_truncated_files(tmp_path):
  assert checkpoint_damage.json_problem(str(tmp_path), "a.json") == "a.json is missing"
  (tmp_path / "a.json").write_text("")
  assert checkpoint_damage.json_problem(str(tmp_path), "a.json") == "a.json is empty"
  (tmp_path / "a.json").write_text('{"step": 3')
  problem = checkpoint_damage.json_problem(str(tmp_path), "a.json")
  assert problem.startswith("a.json is not valid JSON (") and problem.endswith("; truncated?)")
  (tmp_path / "a.json").write_text('{"step": 3}')
  assert checkpoint_damage.json_problem(str(tmp_path), "a.json") is None
  (tmp_path / "b.json").mkdir()
  assert checkpoint_damage.json_problem(str(tmp_path), "b.json") == "b.json is a folder, not a file"


def test_json_problem_passes_no_permission_on_as_no_damage(tmp_path, monkeypatch):
  """An unreadable folder is not a missing file: the good checkpoint must not be set aside."""
  real_stat = os.stat

  def no_permission(path, *args, **kwargs):
    if str(path).startswith(str(tmp_path)):
      raise PermissionError(13, "Permission denied", path)
    return real_stat(path, *args, **kwargs)

  monkeypatch.setattr(checkpoint_damage.os, "stat", no_permission)
  with pytest.raises(PermissionError):
    checkpoint_damage.json_problem(str(tmp_path), "state/_METADATA")
  assert issubclass(PermissionError, checkpoint_damage.NOT_DAMAGE)
