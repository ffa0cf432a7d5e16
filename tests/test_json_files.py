"""Tests for relpos.json_files: whole-or-nothing writes and copies, and one-line read errors."""
import datetime
import errno
import os
import shutil

import pytest

from relpos import json_files


def test_json_round_trip_with_dump_options(tmp_path):
  path = str(tmp_path / "data.json")
  json_files.write_json(path, {"b": [1, 2.5], "a": None}, indent=1, sort_keys=True)
  assert json_files.read_json(path) == {"a": None, "b": [1, 2.5]}
  assert open(path, encoding="utf-8").read().startswith('{\n "a": null')
  assert os.listdir(tmp_path) == ["data.json"]  # no temporary file left


class _FailingFile:
  """A file opened for writing whose writes write half of what they are given, then raise
  OSError (a disk full part-way through); `written` records (file name, bytes on disk)."""
  def __init__(self, f, written):
    self._f, self._written = f, written

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self._f.close()

  def write(self, data):
    self._f.write(data[:len(data) // 2])
    self._f.flush()
    self._written.append((os.path.basename(self._f.name), os.path.getsize(self._f.name)))
    raise OSError(errno.ENOSPC, "No space left on device")


def _fail_mid_write(monkeypatch) -> list:
  """Makes every file opened for writing a `_FailingFile`; returns its `written`."""
  written, real_open = [], open

  def failing_open(name, mode="r", *args, **kwargs):
    f = real_open(name, mode, *args, **kwargs)
    return _FailingFile(f, written) if "w" in mode else f

  monkeypatch.setattr("builtins.open", failing_open)
  return written


@pytest.mark.parametrize("write", ["write_text", "write_bytes", "write_json"])
def test_a_write_failing_part_way_leaves_the_old_file(write, tmp_path, monkeypatch):
  path = str(tmp_path / "data.json")
  json_files.write_text(path, "old")
  written = _fail_mid_write(monkeypatch)
  data = {"write_text": "new " * 1000, "write_bytes": b"new " * 1000, "write_json": ["new"] * 1000}
  with pytest.raises(OSError, match="No space left"):
    getattr(json_files, write)(path, data[write])
  monkeypatch.undo()
  [(name, size)] = written
  assert name != "data.json" and size > 1000  # half the new content was on disk, elsewhere
  assert open(path, encoding="utf-8").read() == "old"
  assert os.listdir(tmp_path) == ["data.json"]  # and that elsewhere is gone


def test_text_that_cannot_be_encoded_leaves_the_old_file(tmp_path):
  """A lone surrogate fails in the UTF-8 encoder, once the file to write is open."""
  path = str(tmp_path / "data.json")
  json_files.write_text(path, "old")
  with pytest.raises(UnicodeEncodeError):
    json_files.write_text(path, "new " * 1000 + "\ud800")
  assert open(path, encoding="utf-8").read() == "old"
  assert os.listdir(tmp_path) == ["data.json"]


def test_invalid_json_is_one_line_naming_the_file(tmp_path):
  path = tmp_path / "half.json"
  path.write_text('{"table": "abl')
  with pytest.raises(ValueError, match=rf"^{path} is not valid JSON \(.*\)\.$"):
    json_files.read_json(str(path))


def test_copy_file_copies_the_bytes_and_a_failed_copy_leaves_the_old_file(tmp_path, monkeypatch):
  source, path = tmp_path / "plot.png", str(tmp_path / "copy.png")
  source.write_bytes(b"\x89PNG\r\n\x00\xff" * 100)
  json_files.write_text(path, "old")
  with pytest.raises(FileNotFoundError):
    json_files.copy_file(str(tmp_path / "missing.png"), path)
  assert open(path, encoding="utf-8").read() == "old"
  copied = []

  def copy_half(src, dst):  # the copy's destination half written, then the disk full
    with open(src, "rb") as f, open(dst, "wb") as out:
      out.write(f.read()[:400])
    copied.append((os.path.basename(dst), os.path.getsize(dst)))
    raise OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(shutil, "copyfile", copy_half)
  with pytest.raises(OSError, match="No space left"):
    json_files.copy_file(str(source), path)
  monkeypatch.undo()
  [(name, size)] = copied
  assert name != "copy.png" and size == 400
  assert open(path, encoding="utf-8").read() == "old"
  assert sorted(os.listdir(tmp_path)) == ["copy.png", "plot.png"]
  json_files.copy_file(str(source), path)
  assert open(path, "rb").read() == b"\x89PNG\r\n\x00\xff" * 100
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


def test_utc_now_is_iso_8601_utc_to_the_second():
  stamp = json_files.utc_now()
  parsed = datetime.datetime.fromisoformat(stamp)
  assert parsed.utcoffset() == datetime.timedelta(0) and parsed.microsecond == 0
  assert abs((datetime.datetime.now(datetime.timezone.utc) - parsed).total_seconds()) < 60
