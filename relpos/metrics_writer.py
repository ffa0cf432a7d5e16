"""A run's records: `metrics.jsonl` (one JSON object a line), TensorBoard events, and
`starts.jsonl` (one line per start of the run: when, from which step, under which commit).

Only process 0 writes. On resume from step s, lines past s (written after the checkpoint the
run restarts from) are dropped and TensorBoard purges events past s, so a restarted run's
files read like an uninterrupted run's.
"""
import json
import math
import os
import platform
import socket
import statistics
import time
from collections.abc import Sequence
from typing import Any

import jax
import tensorboardX

from relpos import json_files
from relpos import workdir_files

# The fields of a record that are timings (train steps per second, a validation's seconds, the
# run's seconds so far) or the machine's load while they were taken: every other field is the
# same in two executions of the same run, resumed or not.
TIMING_FIELDS = ("steps_per_second", "time_s", "elapsed_s", "load_average")
STARTS_FILE = "starts.jsonl"
# A train record was timed on a loaded machine when the load average (runnable threads over
# the last minute, the run's own included) stood above its start's CPU count by more than this.
LOAD_ABOVE_CPUS = 1.0


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


def load_average() -> float | None:
  """The machine's load average over the last minute (runnable threads, this process's
  included), or None where the platform keeps none."""
  try:
    return round(os.getloadavg()[0], 2)
  except (AttributeError, OSError):
    return None


def usable_cpus() -> int:
  """The CPU cores this process may run on."""
  if hasattr(os, "sched_getaffinity"):
    return len(os.sched_getaffinity(0))
  return os.cpu_count() or 1


def is_loaded(load: float, cpus: int) -> bool:
  """Whether a machine with `cpus` cores at load average `load` is loaded: more than
  LOAD_ABOVE_CPUS runnable threads above its cores."""
  return load > cpus + LOAD_ABOVE_CPUS


def machine_load(records: list[dict[str, Any]], starts: list[dict[str, Any]]) -> dict[str, Any]:
  """How loaded the machine was while the run's training steps were timed: its timed train
  records' `load_average` against the `cpus` of the start each record belongs to (the last
  start before the record's step).

  Returns:
    {"median_load_average": the upper median over the timed records that have one (None
       when none has),
     "cpus": of the run's last start (None before starts recorded it),
     "loaded_share": the share of timed records whose load average exceeded their start's CPU
       count by more than LOAD_ABOVE_CPUS (`is_loaded`),
     "unrecorded_share": the share of timed records without a load average or CPU count
       (written before relpos recorded them)}; the shares are None without timed records.
  """
  timed = [r for r in records if r["split"] == "train" and r.get("steps_per_second")]
  loaded = unrecorded = 0
  loads = []
  for record in timed:
    start = [s for s in starts if s["step"] < record["step"]][-1:]
    cpus = start[0].get("cpus") if start else None
    if record.get("load_average") is None or cpus is None:
      unrecorded += 1
      continue
    loads.append(record["load_average"])
    loaded += is_loaded(record["load_average"], cpus)
  share = lambda count: count / len(timed) if timed else None
  return {
      "median_load_average": statistics.median_high(loads) if loads else None,
      "cpus": starts[-1].get("cpus") if starts else None, "loaded_share": share(loaded),
      "unrecorded_share": share(unrecorded)
  }


# The vector instruction sets of x86 CPUs that XLA's CPU code generation chooses between: two
# hosts that differ in them can run the same program to results that differ in the last bits,
# which training amplifies (docs/results.md, the quick start across commits).
CPU_FEATURES = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16")


def host_cpu(cpuinfo: str = "/proc/cpuinfo") -> str:
  """The host's CPU: its model name and which of CPU_FEATURES it has, e.g. "AMD EPYC (avx2, fma,
  avx512f, avx512_bf16)"; platform.machine() where `cpuinfo` cannot be read."""
  try:
    with open(cpuinfo, encoding="utf-8") as f:
      text = f.read()
  except OSError:
    return platform.machine()
  fields = dict(line.split(":", 1) for line in text.split("\n\n")[0].splitlines() if ":" in line)
  fields = {key.strip(): value.strip() for key, value in fields.items()}
  flags = set(fields.get("flags", "").split())
  model = fields.get("model name", platform.machine())
  features = [feature for feature in CPU_FEATURES if feature in flags]
  return f"{model} ({', '.join(features)})" if features else model


# A changed config field: (field, value before, value now).
ConfigChange = tuple[str, Any, Any]


def record_start(workdir: str, step: int, commit: str, variant_code: dict[str, Any] | None = None,
                 *, tokenizer_sha256: str | None = None,
                 config_changes: Sequence[ConfigChange] = (),
                 train_examples: dict[str, Any] | None = None) -> None:
  """Appends a start of the run (UTC time, the step it starts from, the source commit, the
  host, its usable CPU cores, its CPU (`host_cpu`) and device kind, the code of a position
  variant of the user's own: `user_modules.variant_code`, the SHA-256 of the tokenizer it
  trains with, the config fields changed since the last start as {"field", "before",
  "after"}: `config_changes.check_resume`, and what task.max_length did to the training
  examples, {"num_examples", "num_overlong", "action"}: `pipeline.FilterStats`) to
  `workdir/starts.jsonl` (process 0)."""
  if jax.process_index() != 0:
    return
  record = {
      "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "step": step,
      "commit": commit, "host": socket.gethostname(), "cpus": usable_cpus(), "host_cpu": host_cpu(),
      "device_kind": jax.devices()[0].device_kind
  }
  if variant_code is not None:
    record["variant_code"] = variant_code
  if tokenizer_sha256 is not None:
    record["tokenizer_sha256"] = tokenizer_sha256
  if train_examples is not None:
    record["train_examples"] = train_examples
  if config_changes:
    record["config_changes"] = [{"field": field, "before": before, "after": after}
                                for field, before, after in config_changes]
  with open(os.path.join(workdir, STARTS_FILE), "a", encoding="utf-8") as f:
    f.write(json.dumps(record) + "\n")


def read_starts(workdir: str) -> list[dict[str, Any]]:
  """The records of `workdir/starts.jsonl`, oldest first (empty when there is none)."""
  path = os.path.join(workdir, STARTS_FILE)
  if not os.path.exists(path):
    return []
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.endswith("\n")]


def check_tokenizer(workdir: str, tokenizer_sha256: str, tokenizer_path: str) -> None:
  """Refuses a tokenizer other than the one the run's last start recorded (starts.jsonl): its
  checkpoints were trained on that tokenizer's ids, and another one (a data folder on another
  machine, a tokenizer trained again) would feed and decode other ids without an error. A run
  started before tokenizers were recorded is not checked; nor is a start that saved no
  checkpoint (`train.open_workdir` asks only when resuming).

  Raises:
    ValueError: naming the tokenizer file, both hashes and what to do.
  """
  recorded = [s["tokenizer_sha256"] for s in read_starts(workdir) if "tokenizer_sha256" in s]
  if recorded and recorded[-1] != tokenizer_sha256:
    raise ValueError(
        f"the tokenizer {tokenizer_path} (sha256 {tokenizer_sha256[:12]}) is not the one the "
        f"checkpoints in {workdir} were trained with (sha256 {recorded[-1][:12]}, {STARTS_FILE}):"
        f" its ids mean other pieces. Point task.tfds_data_dir (or $RELPOS_DATA_DIR) at the data "
        f"folder the run was trained with, or train in a new --workdir.")


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
    # Whole or not at all: a kill here leaves the old history, never an empty or partial one
    # (the validation curve, early stopping's count and the run's seconds come from it).
    json_files.write_text(self._path, "".join(json.dumps(r) + "\n" for r in kept))
    self._tensorboard = tensorboardX.SummaryWriter(
        os.path.join(workdir, workdir_files.TENSORBOARD_DIR),
        purge_step=resume_step + 1)  # a start from 0 too: an earlier one may have logged

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
