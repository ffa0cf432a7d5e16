"""What a job on an offline GPU host gives back (tools/gpu_job.py): the host's limits on what
comes back from $OUT, a table's finished runs and their files, an archive that fits, a log cut to
its head and tail, and the check that $OUT holds nothing the host would not return.

Standard library only: it runs before the job's wheels are installed.
"""
import os
import re
import tarfile
from typing import NamedTuple

# What the host gives back from $OUT.
MAX_FILES = 8
MAX_FILE_BYTES = 16 * 2**20
MAX_TOTAL_BYTES = 64 * 2**20
MAX_DEPTH = 2  # folders below $OUT


class ReturnLimits(NamedTuple):
  """What the host gives back of --out (the defaults: --max_files and the others)."""
  files: int = MAX_FILES
  file_bytes: int = MAX_FILE_BYTES
  total_bytes: int = MAX_TOTAL_BYTES
  depth: int = MAX_DEPTH


NAME = re.compile(r"[A-Za-z0-9._-]+")
MAX_LOG_BYTES = 8 * 2**20  # job.log keeps its head and its tail beyond this
LOG_HEAD_BYTES = 2**20


def table_runs(table_dir: str) -> tuple[list[str], list[str]]:
  """(finished, unfinished) run folders of a table: a finished one holds result.json."""
  runs_dir = os.path.join(table_dir, "runs")
  names = sorted(os.listdir(runs_dir)) if os.path.isdir(runs_dir) else []
  finished = [n for n in names if os.path.exists(os.path.join(runs_dir, n, "result.json"))]
  return finished, [n for n in names if n not in finished]


# A tqdm update of a training run's log: "5435/8000 [07:16<03:25, 12.46step/s" (or, below one
# step a second, "1/8000 [00:42<93:23:06, 42.03s/step").
_PROGRESS = re.compile(rb"(\d+)/(\d+) \[[^\]]*?([\d.]+)(step/s|s/step)")


def run_progress(log_path: str, tail_bytes: int = 65536) -> str | None:
  """'step N of M, R steps/s' from the last progress bar in a run's log, or None."""
  if not os.path.exists(log_path):
    return None
  with open(log_path, "rb") as f:
    f.seek(max(0, os.path.getsize(log_path) - tail_bytes))
    matches = _PROGRESS.findall(f.read())
  if not matches:
    return None
  step, total, rate, unit = (m.decode() for m in matches[-1])
  steps_per_second = float(rate) if unit == "step/s" else 1 / float(rate)
  return f"step {step} of {total}, {steps_per_second:.4g} steps/s"


def table_files(table_dir: str) -> list[str]:
  """The files of a table's output folder worth returning: no checkpoints, no unfinished run."""
  _, unfinished = table_runs(table_dir)
  skipped = {os.path.join(table_dir, "runs", n) for n in unfinished}
  files = []
  for dirpath, dirnames, filenames in os.walk(table_dir):
    dirnames[:] = sorted(
        d for d in dirnames if d != "checkpoints" and os.path.join(dirpath, d) not in skipped)
    files += [os.path.join(dirpath, f) for f in sorted(filenames)]
  return files


def write_archive(files: list[str], base: str, path: str, limit: int = MAX_FILE_BYTES) -> list[str]:
  """Writes `files` (named relative to `base`) to the tar.gz `path`, leaving out the largest
  until it is at most `limit` bytes; returns those left out (relative names)."""
  kept, left_out = sorted(files, key=os.path.getsize), []
  while True:
    with tarfile.open(path, "w:gz") as archive:
      for f in kept:
        archive.add(f, arcname=os.path.relpath(f, base))
    if os.path.getsize(path) <= limit or not kept:
      return left_out
    left_out.append(os.path.relpath(kept.pop(), base))


def trim_log(path: str, limit: int = MAX_LOG_BYTES, head: int = LOG_HEAD_BYTES) -> None:
  """Keeps the first `head` bytes and the last ones of a file larger than `limit`."""
  size = os.path.getsize(path)
  if size <= limit:
    return
  marker = f"\n[gpu_job: {size - limit} bytes of log left out here]\n".encode()
  with open(path, "rb") as f:
    start = f.read(head)
    f.seek(size - (limit - head - len(marker)))
    end = f.read()
  with open(path, "wb") as f:
    f.write(start + marker + end)


def check_returnable(out: str, limits: ReturnLimits = ReturnLimits()) -> dict[str, int]:
  """The files under `out` (relative path -> bytes), as the host gives them back.

  Raises:
    ValueError: naming the path, for a name, depth, size or count the host would not return.
  """
  sizes = {}
  for dirpath, dirnames, filenames in os.walk(out):
    for name in dirnames + filenames:
      if not NAME.fullmatch(name):
        raise ValueError(f"{os.path.join(dirpath, name)}: only letters, digits, '.', '_' and "
                         "'-' come back.")
    for name in filenames:
      path = os.path.join(dirpath, name)
      relative = os.path.relpath(path, out)
      if relative.count(os.sep) > limits.depth:
        raise ValueError(f"{path}: more than {limits.depth} folders below {out}.")
      sizes[relative] = os.path.getsize(path)
      if sizes[relative] > limits.file_bytes:
        raise ValueError(f"{path}: {sizes[relative]} bytes, over {limits.file_bytes}.")
  if len(sizes) > limits.files:
    raise ValueError(f"{out}: {len(sizes)} files, over {limits.files}.")
  if sum(sizes.values()) > limits.total_bytes:
    raise ValueError(f"{out}: {sum(sizes.values())} bytes in all, over {limits.total_bytes}.")
  return sizes
