"""JSON and text files written (or copied) whole or not at all, and JSON read with one-line
errors."""
import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def _replacing(path: str) -> Iterator[str]:
  """Yields a temporary path beside `path`, renamed to `path` once the block has written it
  whole; removed if the block fails, so `path` keeps its old content."""
  try:
    yield path + ".tmp"
    os.replace(path + ".tmp", path)
  finally:
    if os.path.exists(path + ".tmp"):
      os.remove(path + ".tmp")


def write_text(path: str, text: str) -> None:
  """Writes `text` (UTF-8) to `path` whole or not at all (a temporary file renamed), so that a
  reader never sees half of it and a failed write leaves the old file."""
  with _replacing(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
    f.write(text)


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
