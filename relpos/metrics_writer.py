"""A run's records: `metrics.jsonl` (one JSON object a line), TensorBoard events, and
`starts.jsonl` (one line per start of the run: when, from which step, under which commit).

Only process 0 writes. On resume from step s, lines past s (written after the checkpoint the
run restarts from) are dropped and TensorBoard purges events past s, so a restarted run's
files read like an uninterrupted run's.
"""
import json
import math
import os
import socket
import time
from typing import Any

import jax
import tensorboardX

from relpos import workdir_files

# The fields of a record that are timings (train steps per second, a validation's seconds, the
# run's seconds so far): every other field is the same in two executions of the same run,
# resumed or not.
TIMING_FIELDS = ("steps_per_second", "time_s", "elapsed_s")
STARTS_FILE = "starts.jsonl"


def without_timing(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """`records` without their TIMING_FIELDS."""
  return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in records]


def read_metrics(workdir: str) -> list[dict[str, Any]]:
  """Returns the records of `workdir/metrics.jsonl` (empty when there is none; an unended last
  line, cut by a kill, is not a record).

  Raises:
    ValueError: a line that is not a JSON record, naming the file, the line and how to go on.
  """
  path = os.path.join(workdir, workdir_files.METRICS_FILE)
  if not os.path.exists(path):
    return []
  records = []
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, start=1):
      if not line.endswith("\n"):
        break
      try:
        record = json.loads(line)
      except ValueError as e:
        record = e
      if not isinstance(record, dict):
        cause = f" ({record})" if isinstance(record, ValueError) else ""
        raise ValueError(f"{path}:{number} is not a JSON record{cause}: repair or delete that "
                         "line (the checkpoints do not need it).")
      records.append(record)
  return records


def elapsed_seconds(records: list[dict[str, Any]]) -> float:
  """Seconds the run took to make `records` (training, its validations, checkpoints and
  compilation), summed over every start of the run.

  A train record's `elapsed_s` is that sum at its writing; a validation record's `time_s` comes
  after it (its step's train record is written first). Records written before `elapsed_s`
  existed add their interval's steps over its steps per second instead: an estimate that leaves
  out compilation.
  """
  total, previous_step = 0.0, 0
  for record in records:
    if record["split"] == "train":
      if record.get("elapsed_s") is not None:
        total = record["elapsed_s"]
      elif record.get("steps_per_second"):
        total += (record["step"] - previous_step) / record["steps_per_second"]
      previous_step = record["step"]
    elif record.get("time_s") is not None:
      total += record["time_s"]
  return total


def record_start(workdir: str, step: int, commit: str) -> None:
  """Appends a start of the run (UTC time, the step it starts from, the source commit and the
  host) to `workdir/starts.jsonl` (process 0)."""
  if jax.process_index() != 0:
    return
  record = {
      "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "step": step,
      "commit": commit, "host": socket.gethostname()
  }
  with open(os.path.join(workdir, STARTS_FILE), "a", encoding="utf-8") as f:
    f.write(json.dumps(record) + "\n")


def read_starts(workdir: str) -> list[dict[str, Any]]:
  """The records of `workdir/starts.jsonl`, oldest first (empty when there is none)."""
  path = os.path.join(workdir, STARTS_FILE)
  if not os.path.exists(path):
    return []
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.endswith("\n")]


class MetricsWriter:
  """Appends metric records to `metrics.jsonl` and TensorBoard scalars under `tensorboard/`.

  A context manager: leaving it closes the TensorBoard writer.
  """
  def __init__(self, workdir: str, *, resume_step: int):
    """Opens the writers.

    Args:
      workdir: the run's folder.
      resume_step: the step the run starts from (0 for a fresh run); records past it go.
    """
    self._active = jax.process_index() == 0
    self._path = os.path.join(workdir, workdir_files.METRICS_FILE)
    if not self._active:
      return
    kept = [r for r in read_metrics(workdir) if r["step"] <= resume_step]
    with open(self._path, "w", encoding="utf-8") as f:
      f.writelines(json.dumps(r) + "\n" for r in kept)
    self._tensorboard = tensorboardX.SummaryWriter(
        os.path.join(workdir, workdir_files.TENSORBOARD_DIR),
        purge_step=resume_step + 1 if resume_step else None)

  def write(self, step: int, split: str, metrics: dict[str, Any]) -> None:
    """Writes one record {"step", "split", **metrics} as strict JSON (a NaN or infinite value
    becomes null); finite numbers also go to TensorBoard."""
    if not self._active:
      return
    metrics = {
        k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in metrics.items()
    }
    record = {"step": step, "split": split, **metrics}
    with open(self._path, "a", encoding="utf-8") as f:
      f.write(json.dumps(record, allow_nan=False) + "\n")
    for name, value in metrics.items():
      if isinstance(value, (int, float)) and not isinstance(value, bool):
        self._tensorboard.add_scalar(f"{split}/{name}", value, step)
    self._tensorboard.flush()

  def __enter__(self) -> "MetricsWriter":
    return self

  def __exit__(self, *exc_info) -> None:
    if self._active:
      self._tensorboard.close()
