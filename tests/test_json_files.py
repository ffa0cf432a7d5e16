"""Tests for relpos.json_files: whole-or-nothing writes and copies, and one-line read errors."""
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


def test_copy_file_copies_the_bytes_and_a_failed_copy_leaves_the_old_file(tmp_path):
  source, path = tmp_path / "plot.png", str(tmp_path / "copy.png")
  source.write_bytes(b"\x89PNG\r\n\x00\xff")
  json_files.write_text(path, "old")
  with pytest.raises(FileNotFoundError):
    json_files.copy_file(str(tmp_path / "missing.png"), path)
  assert open(path, encoding="utf-8").read() == "old"
  json_files.copy_file(str(source), path)
  assert open(path, "rb").read() == b"\x89PNG\r\n\x00\xff"
  assert sorted(os.listdir(tmp_path)) == ["copy.png", "plot.png"]  # no temporary file left


def test_writers_on_several_hosts_never_share_a_temporary_file(tmp_path, monkeypatch):
  """Processes of two hosts (the same pid, as containers give) writing one file of a shared
  folder each write their own temporary file, then rename it whole."""
  path = str(tmp_path / "tokenizer.model")
  seen = []
  real_open = open

  def recording_open(name, *args, **kwargs):
    seen.append(os.path.basename(name))
    return real_open(name, *args, **kwargs)

  monkeypatch.setattr(json_files.os, "getpid", lambda: 1)
  monkeypatch.setattr("builtins.open", recording_open)
  for host in ("host-a", "host-b"):
    monkeypatch.setattr(json_files.socket, "gethostname", lambda host=host: host)
    json_files.write_bytes(path, host.encode())
  assert seen == ["tokenizer.model.tmp.host-a.1", "tokenizer.model.tmp.host-b.1"]
  monkeypatch.undo()
  assert open(path, "rb").read() == b"host-b" and os.listdir(tmp_path) == ["tokenizer.model"]
