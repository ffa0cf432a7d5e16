"""What makes a checkpoint "damaged", and what a user reads of it.

A checkpoint whose files are missing, empty, truncated or unreadable is damaged
(`DamagedCheckpointError`, naming the file or the read that failed): `relpos.checkpoints` skips
it for the newest one that restores, and sets it aside. A fault of the machine while reading
(`NOT_DAMAGE`: a timeout, no permission, no memory) is not damage and passes unchanged, so a
healthy checkpoint is never replaced by an older one for it.
"""
import contextlib
import json
import os
import re
import stat
from collections.abc import Iterator

MAX_CAUSE_CHARS = 400  # of an error's message shown to a user

# What reading a checkpoint may raise that says nothing of its files (a network folder's
# timeout, no permission, no memory): set aside for it, a healthy newest checkpoint would be
# replaced by an older one for a fault a second try does not have (`reading`).
NOT_DAMAGE = (TimeoutError, ConnectionError, PermissionError, MemoryError)


class DamagedCheckpointError(ValueError):
  """A checkpoint whose files are missing, truncated or unreadable."""


def short_cause(error: BaseException, max_chars: int | None = MAX_CAUSE_CHARS) -> str:
  """What a user needs of an error from tensorstore, Orbax or grain: the first line of its
  message, without the tensorstore spec and details that follow the file and the reason (they
  run to 1,000 characters), cut at `max_chars` (None: whole)."""
  cause = (str(error).strip().splitlines() or [type(error).__name__])[0]
  cause = re.split(r" See full TensorStore details| \[tensorstore_spec=| \[source locations=",
                   cause)[0]
  if max_chars is None or len(cause) <= max_chars:
    return cause
  return cause[:max_chars - 3] + "..."


@contextlib.contextmanager
def reading(where: str) -> Iterator[None]:
  """Turns what reading the damaged checkpoint in folder `where` raises (tensorstore, orbax,
  grain: of many types) into a DamagedCheckpointError that keeps the first line of the cause;
  `NOT_DAMAGE` (and BaseExceptions such as a requested stop) pass unchanged."""
  try:
    yield
  except NOT_DAMAGE:
    raise
  except Exception as e:  # pylint: disable=broad-exception-caught
    raise DamagedCheckpointError(f"checkpoint {where} is damaged: reading it failed: "
                                 f"{short_cause(e).rstrip('.')}.") from e


def json_problem(where: str, name: str) -> str | None:
  """What is wrong with the JSON file `name` of the checkpoint in folder `where` (None:
  nothing): missing, empty, or not valid JSON (truncated).

  Raises:
    PermissionError: the file or a folder above it cannot be read (no damage: `NOT_DAMAGE`).
  """
  path = os.path.join(where, name)
  try:
    found = os.stat(path)  # (os.path.isfile would read no permission as missing)
  except (FileNotFoundError, NotADirectoryError):
    return f"{name} is missing"
  if stat.S_ISDIR(found.st_mode):
    return f"{name} is a folder, not a file"
  if found.st_size == 0:
    return f"{name} is empty"
  try:
    with open(path, encoding="utf-8") as f:
      json.load(f)
  except ValueError as e:
    return f"{name} is not valid JSON ({e}; truncated?)"
  return None
