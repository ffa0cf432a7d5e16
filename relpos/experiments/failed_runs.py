"""Runs of a table that ended without a result: each one's failure, recorded in its own folder,
so that results.json, table.md and `--status` name the run and its error, not only the log of
the table process that ran it (a row short of a seed would otherwise only show a lower count).

The runner writes FAILURE_FILE into a run's folder when the run fails (an error in process, or a
child process that ended with a non-zero status and no result) and removes it when it starts the
run again; a restart of the table's command resumes the run from its newest checkpoint. A record
counts only while the run has no result.json (`results.collect_failed`).

A failure: {"error": its first line, "failed_at": UTC time, "checkpoint": the newest checkpoint's
step when it failed (None: none saved), "log": the child process's log, or None in process}.
"""
import os
from typing import Any

from relpos import checkpoints
from relpos import json_files

FAILURE_FILE = "failed.json"


def record(workdir: str, error: str, *, log: str | None = None) -> None:
  """Records that the run in `workdir` failed with `error` (its first line is kept)."""
  lines = str(error).strip().splitlines()
  os.makedirs(workdir, exist_ok=True)
  json_files.write_json(
      os.path.join(workdir, FAILURE_FILE), {
          "error": lines[0] if lines else "unknown error", "failed_at": json_files.utc_now(),
          "checkpoint": checkpoints.newest_step(workdir), "log": log
      })


def clear(workdir: str) -> None:
  """Removes the run's failure record (it is started again)."""
  path = os.path.join(workdir, FAILURE_FILE)
  if os.path.exists(path):
    os.remove(path)


def read(workdir: str) -> dict[str, Any] | None:
  """The run's failure record; None when it has none (`results.collect_failed` leaves out a
  finished run's).

  Raises:
    ValueError: naming the file when it is not JSON.
  """
  path = os.path.join(workdir, FAILURE_FILE)
  return json_files.read_json(path) if os.path.exists(path) else None


def describe(failure: dict[str, Any]) -> str:
  """ "<run> (<error>; failed at <time>, newest checkpoint step N; log <path>)"."""
  checkpoint = failure.get("checkpoint")
  where = f"newest checkpoint step {checkpoint}" if checkpoint is not None else "no checkpoint"
  log = f"; log {failure['log']}" if failure.get("log") else ""
  when = failure.get("failed_at", "?").replace("T", " ").replace("+00:00", " UTC")
  return f"{failure['run']} ({failure['error']}; failed {when}, {where}{log})"


def note(failed: list[dict[str, Any]]) -> str:
  """The sentence naming `failed` (`results.collect_failed`) in table.md and `--status`; ""
  when none."""
  if not failed:
    return ""
  return ("Failed, so left out of the table: " + "; ".join(map(describe, failed)) +
          ". The table's command trains each again from its newest checkpoint.")
