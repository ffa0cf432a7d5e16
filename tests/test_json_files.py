"""Tests for relpos.json_files: whole-or-nothing writes and one-line read errors."""
import os

import pytest

from relpos import json_files


def test_json_round_trip_with_dump_options(tmp_path):
  path = str(tmp_path / "data.json")
  json_files.write_json(path, {"b": [1, 2.5], "a": None}, indent=1, sort_keys=True)
  assert json_files.read_json(path) == {"a": None, "b": [1, 2.5]}
  assert open(path, encoding="utf-8").read().startswith('{\n "a": null')
  assert os.listdir(tmp_path) == ["data.json"]  # no temporary file left


def test_a_failed_write_leaves_the_old_file(tmp_path):
  path = str(tmp_path / "data.json")
  json_files.write_text(path, "old")
  with pytest.raises(TypeError):
    json_files.write_json(path, {"not JSON": object()})
  assert open(path, encoding="utf-8").read() == "old"
  assert os.listdir(tmp_path) == ["data.json"]


def test_invalid_json_is_one_line_naming_the_file(tmp_path):
  path = tmp_path / "half.json"
  path.write_text('{"table": "abl')
  with pytest.raises(ValueError, match=rf"^{path} is not valid JSON \(.*\)\.$"):
    json_files.read_json(str(path))
