"""JSON, text and binary files written (or copied) whole or not at all, JSON read with
one-line errors, and the UTC time stamp such records carry."""
import contextlib
import datetime
import json
import os
import shutil
import socket
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def _replacing(path: str) -> Iterator[str]:
  """Yields a temporary path beside `path`, renamed to `path` once the block has written it
  whole; removed if the block fails, so `path` keeps its old content. The temporary name is
  the writer's own (host and process), so that processes on several hosts writing the same
  file of a shared folder (a tokenizer, a download) never write into one temporary file."""
  tmp = f"{path}.tmp.{socket.gethostname()}.{os.getpid()}"
  try:
    yield tmp
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def write_text(path: str, text: str) -> None:
  """Writes `text` (UTF-8) to `path` whole or not at all (a temporary file renamed), so that a
  reader never sees half of it and a failed write leaves the old file."""
  with _replacing(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
    f.write(text)


def write_bytes(path: str, data: bytes) -> None:
  """Writes `data` to `path` whole or not at all (as `write_text`)."""
  with _replacing(path) as tmp, open(tmp, "wb") as f:
    f.write(data)


def copy_file(source: str, path: str) -> None:
  """Copies `source` to `path` whole or not at all (as `write_text`), its bytes unchanged."""
  with _replacing(path) as tmp:
    shutil.copyfile(source, tmp)


def write_json(path: str, data: Any, **dump_options: Any) -> None:
  """Writes `data` as JSON to `path` whole or not at all (`write_text`); `dump_options` go to
  `json.dumps` (indent, sort_keys)."""
  write_text(path, json.dumps(data, **dump_options))


def read_json(path: str) -> Any:
  """The JSON data in `path`.

  Raises:
    ValueError: naming the file, when it is not whole JSON.
  """
  with open(path, encoding="utf-8") as f:
    try:
      return json.load(f)
    except ValueError as e:
      raise ValueError(f"{path} is not valid JSON ({e}).") from None


def utc_now() -> str:
  """The current UTC time, ISO 8601 to the second: the time stamp of relpos's records
  (`written_at`, `finished_at`, `restored.at`, `found_at`), e.g. "2026-11-28T11:30:00+00:00"."""
  return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
