r"""One job on a bare, offline GPU host: install the carried wheels, run, pack the results.

  python3 tools/gpu_job.py JOB [--budget_s=570] [--dry_run] [ARGS...]

The host is one with no internet and a time limit per job (e.g. a cluster's compute node): it
takes the working tree and `bundle/` (made by `tools.gpu_bundle`) in and gives back what the job
writes under --out ($OUT). --budget_s is the job's time limit less a margin; the output is
checked against what the host gives back: --max_files files of at most --max_file_mib
(--max_total_mib in all), --max_depth folders deep. This program
uses the standard library alone, so it runs before the wheels are in. It

1. installs `bundle/wheels/*.whl` into /tmp/site (no index, no dependencies) for its children,
   and checks that relpos imports, logging the package versions and the devices;
2. runs JOB with the datasets of `bundle/data`, its output copied to $OUT/job.log, and stops it
   with SIGTERM (to its whole process group) once the time budget nears: a training run saves a
   checkpoint and returns, the table writes its outputs; SIGKILL follows after STOP_GRACE_S;
3. packs into $OUT: job.log, job.json (command, exit status, versions, finished and unfinished
   runs, the step and steps/s each unfinished run reached, returned files), the job's own
   result files and, for a table, `results.tar.gz` of its output folder: finished runs only,
   no checkpoints.

JOB is `tests` (the test suite, on CPU as conftest.py sets), `gpu_tests` (tests/test_gpu.py on
the accelerator: cuDNN against XLA, bfloat16 training), `benchmarks` (results.json and
results.md of benchmarks/, the CPU section kept beside the new one) or `<task>_<table>`
(`python -m relpos.experiments.run`, 1 seed; `multi30k_gpu_ablation` is the Multi30K GPU
recipe). ARGS go to the end of the job's command and win over its own flags: `--parallel=2`,
`--seeds=3`, `--rows=abs,rel_kv`, `--set=train.num_steps=5000`, or pytest's `-n 8 -x`.

A table continues across jobs: its output folder is `bundle/results/<JOB>`; unpack the returned
archive there before the next machine's first job (`mkdir -p bundle/results && tar -xzf
results.tar.gz -C bundle/results`, then carry `bundle` with that job) and the finished runs are
skipped. An unfinished run's checkpoints are too large to come back, so on another machine it
starts again from step 0: give each run a budget (`--set=train.num_steps=...`) that finishes
inside one job. On the same held machine, a later job without `bundle` carried resumes them (a
carried `bundle` would replace the folder, checkpoints and all).

`--dry_run` runs the job at tiny size (seconds to a minute on a CPU) into a temporary results
folder, for checking the whole path (wheels, data, packing) without a GPU.
"""

import argparse
import dataclasses
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, BinaryIO

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUNDLE_DIR = os.path.join(ROOT, "bundle")
WHEELS_DIR = os.path.join(BUNDLE_DIR, "wheels")
DATA_DIR = os.path.join(BUNDLE_DIR, "data")
RESULTS_DIR = os.path.join(BUNDLE_DIR, "results")

sys.path.insert(0, ROOT)  # run by path: the repository's root, for tools.job_output
from tools import job_output  # pylint: disable=wrong-import-position

DEFAULT_BUDGET_S = 570.0  # the host's limit is 600 s a command
STOP_GRACE_S = 60.0  # after SIGTERM: the step in flight, a checkpoint, the table's outputs
PACK_RESERVE_S = 30.0  # rebuilding a stopped table's outputs, packing
LOG_NAME, SUMMARY_NAME, ARCHIVE_NAME = "job.log", "job.json", "results.tar.gz"

TASKS = ("synthetic", "multi30k", "multi30k_gpu")  # bases of configs/ablation.py
TABLES = ("ablation", "k_sweep")
JOB_NAMES = ("tests", "gpu_tests", "benchmarks") + tuple(
    f"{task}_{table}" for task in TASKS for table in TABLES)
VERSIONS_OF = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "ml_collections",
               "grain", "tensorflow-datasets", "array_record", "sentencepiece", "sacrebleu",
               "tensorboardX", "matplotlib", "pytest")

# A table at tiny size: one row, two steps of a width-16 model, greedy decoding of 8 tokens.
_DRY_RUN_SETTINGS = ("model.emb_dim=16", "model.qkv_dim=16", "model.mlp_dim=32",
                     "model.num_heads=2", "model.num_encoder_layers=1",
                     "model.num_decoder_layers=1", "train.num_steps=2", "train.batch_size=8",
                     "train.warmup_steps=1", "train.log_every_steps=1", "train.eval_every_steps=2",
                     "train.checkpoint_every_steps=2", "decode.beam_size=1",
                     "decode.max_decode_len=8", "decode.validation_bleu=False",
                     "decode.length_diagnostics=False")
_DRY_RUN_TASK_SETTINGS = {  # multi30k keeps its data and tokenizer (bundle/data)
    "synthetic":
        ("task.vocab_size=64", "task.synthetic.num_train=200", "task.synthetic.num_validation=8",
         "task.synthetic.num_test=8", "task.synthetic.num_test_long=8"),
    "multi30k": (),
    "multi30k_gpu": ("decode.other_checkpoints=''",)  # average:10 needs 10 saved checkpoints
}
_DRY_RUN_ROW = {"ablation": "abs", "k_sweep": "k=2"}

# Run in a child with the job's environment: fails if relpos cannot import; prints a JSON line.
_CHECK = """
import importlib.metadata, json, platform, sys
import jax
import relpos.experiments.runner
def version(name):
  try:
    return importlib.metadata.version(name)
  except importlib.metadata.PackageNotFoundError:
    return None
print(json.dumps({"python": platform.python_version(), "backend": jax.default_backend(),
                  "devices": [str(d) for d in jax.devices()],
                  "packages": {n: version(n) for n in sys.argv[1:]}}))
"""
_REBUILD = "import sys; from relpos.experiments import results; results.write_outputs(sys.argv[1])"


@dataclasses.dataclass(frozen=True)
class Job:
  """What a job runs and gives back.

  Attributes:
    args: the Python arguments of its command (ARGS are appended).
    dry_run_args: the same at tiny size.
    files: files returned as they are, when they exist.
    table_dir: a table's output folder (returned as ARCHIVE_NAME), or None.
    starts_with: destination -> source: files copied into place before the run unless there.
    env: environment variables of its command, over the job environment's.
    needs_gpu: stop before the command where jax sees no GPU (a CPU-only jax would spend
      the budget on the CPU); a dry run is never stopped so.
  """
  args: tuple[str, ...]
  dry_run_args: tuple[str, ...]
  files: tuple[str, ...] = ()
  table_dir: str | None = None
  starts_with: dict[str, str] = dataclasses.field(default_factory=dict)
  env: dict[str, str] = dataclasses.field(default_factory=dict)
  needs_gpu: bool = True


def job_spec(name: str, results_root: str) -> Job:
  """The Job called `name` (one of JOB_NAMES), its outputs under `results_root`.

  Raises:
    ValueError: an unknown job name.
  """
  if name == "tests":
    return Job(("-m", "pytest", "-q", "tests"), ("-m", "pytest", "-q", "tests/test_positions.py"),
               needs_gpu=False)
  if name == "gpu_tests":  # the accelerator tests; JAX may take the GPU (not conftest's CPU)
    args = ("-m", "pytest", "-q", "-rs", "tests/test_gpu.py")
    return Job(args, args, env={"JAX_PLATFORMS": ""})
  output_dir = os.path.join(results_root, name)
  if name == "benchmarks":
    args = ("-m", "benchmarks.run", f"--results_dir={output_dir}")
    return Job(
        args, args + ("--quick", "--sections=decode"),
        files=tuple(os.path.join(output_dir, f) for f in ("results.json", "results.md")),
        starts_with={
            os.path.join(output_dir, "results.json"): os.path.join(ROOT, "benchmarks",
                                                                   "results.json")
        })
  if name not in JOB_NAMES:
    raise ValueError(f"unknown job {name!r}; allowed: {', '.join(JOB_NAMES)}.")
  task, table = next(
      (name[:-len(table) - 1], table) for table in TABLES if name.endswith(f"_{table}"))
  args = ("-m", "relpos.experiments.run", f"--table={table}", f"--task={task}", "--seeds=1",
          f"--output_dir={output_dir}")
  dry_run = (f"--rows={_DRY_RUN_ROW[table]}",) + tuple(
      f"--set={s}" for s in _DRY_RUN_SETTINGS + _DRY_RUN_TASK_SETTINGS[task])
  return Job(args, args + dry_run,
             files=tuple(os.path.join(output_dir, f) for f in ("results.json", "table.md")),
             table_dir=output_dir)


class Log:
  """Bytes written both to stdout and to a file, flushed as they come."""
  def __init__(self, path: str):
    self.path = path
    self._file = open(path, "wb")  # pylint: disable=consider-using-with
    self._start = time.monotonic()
    self._line_open = False  # the last bytes written end inside a line (a progress bar)

  def write(self, data: bytes) -> None:
    if not data:
      return
    self._line_open = not data.endswith(b"\n")
    self._file.write(data)
    self._file.flush()
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()

  def say(self, text: str) -> None:
    """One line of this program's own, with the seconds since the log was opened."""
    start = "\n" if self._line_open else ""
    self.write(f"{start}gpu_job [{time.monotonic() - self._start:.0f} s]: {text}\n".encode())

  def close(self) -> None:
    self._file.close()


def _copy_output(pipe: BinaryIO, log: Log) -> None:
  for chunk in iter(lambda: os.read(pipe.fileno(), 65536), b""):
    log.write(chunk)


def run_until(command: list[str], env: dict[str, str], deadline: float, log: Log,
              grace_s: float = STOP_GRACE_S) -> tuple[int, bool]:
  """Runs `command` in its own process group, its output into `log`, until it ends or until
  `deadline` (`time.monotonic()`): then SIGTERM to the group, SIGKILL after `grace_s`.

  Returns:
    (the exit status, negative for a signal; whether the deadline stopped it).
  """
  process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, start_new_session=True)
  copier = threading.Thread(target=_copy_output, args=(process.stdout, log))
  copier.start()
  stopped = False
  try:
    process.wait(timeout=max(0.0, deadline - time.monotonic()))
  except subprocess.TimeoutExpired:
    stopped = True
    log.say(f"time budget reached: SIGTERM to the job, SIGKILL in {grace_s:.0f} s.")
    os.killpg(process.pid, signal.SIGTERM)
    try:
      process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
      log.say("the job is still running: SIGKILL.")
  try:  # whatever of the group is left (it would hold the output pipe open)
    os.killpg(process.pid, signal.SIGKILL)
  except ProcessLookupError:
    pass
  process.wait()
  copier.join()
  process.stdout.close()
  return process.returncode, stopped


def install_wheels(wheels_dir: str, site: str, log: Log) -> str | None:
  """Installs every wheel of `wheels_dir` into `site`; returns `site`, or None (logging why)
  when there is none to install or pip fails: the import check that follows then tells whether
  the packages installed already suffice."""
  wheels = sorted(
      f for f in os.listdir(wheels_dir) if f.endswith(".whl")) if os.path.isdir(wheels_dir) else []
  if not wheels:
    log.say(f"no wheels in {wheels_dir!r}: using the packages installed already.")
    return None
  command = [
      sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
      "--no-cache-dir", "--upgrade", "--target", site,
      *(os.path.join(wheels_dir, f) for f in wheels)
  ]
  done = subprocess.run(command, capture_output=True, check=False)
  log.write(done.stdout + done.stderr)
  if done.returncode:
    log.say(f"pip could not install the wheels of {wheels_dir} into {site}.")
    return None
  log.say(f"installed {len(wheels)} wheels into {site}.")
  return site


def job_environment(site: str | None, data_dir: str) -> dict[str, str]:
  """The children's environment: the wheels first on the path, the bundled datasets, unbuffered
  output, and GPU memory taken as needed (several processes may share the GPU)."""
  env = dict(os.environ, PYTHONUNBUFFERED="1", RELPOS_DATA_DIR=os.path.abspath(data_dir))
  if site:
    env["PYTHONPATH"] = os.pathsep.join(p for p in (site, env.get("PYTHONPATH")) if p)
  env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  return env


def check_packages(env: dict[str, str], log: Log) -> dict[str, Any] | None:
  """Python, devices and package versions as a child with `env` sees them, after importing
  relpos (with everything it needs); None, logging why, when that fails."""
  done = subprocess.run([sys.executable, "-c", _CHECK, *VERSIONS_OF], cwd=ROOT, env=env,
                        capture_output=True, check=False)
  if done.returncode:
    log.write(done.stdout + done.stderr)
    log.say("relpos does not import with these packages: stopping before the job.")
    return None
  versions = json.loads(done.stdout.decode().strip().splitlines()[-1])
  log.say(f"python {versions['python']}, devices {versions['devices']}")
  log.say(" ".join(f"{k}={v}" for k, v in versions["packages"].items()))
  return versions


def pack(job: Job, out: str, results_root: str, summary: dict[str, Any], log: Log,
         limits: job_output.ReturnLimits = job_output.ReturnLimits()) -> None:
  """Copies the job's files, the table's archive and `summary` (completed) into `out`."""
  for path in job.files:
    if os.path.exists(path):
      shutil.copyfile(path, os.path.join(out, os.path.basename(path)))
  if job.table_dir and os.path.isdir(job.table_dir):
    finished, unfinished = job_output.table_runs(job.table_dir)
    left_out = job_output.write_archive(job_output.table_files(job.table_dir), results_root,
                                        os.path.join(out, ARCHIVE_NAME), limits.file_bytes)
    run_logs = {n: os.path.join(job.table_dir, "runs", n, "run.log") for n in unfinished}
    without_log = [n for n, path in run_logs.items() if not os.path.exists(path)]
    if len(without_log) == 1:  # the run in flight of --parallel=1: its progress is the job's
      run_logs[without_log[0]] = log.path
    progress = {n: job_output.run_progress(path) for n, path in run_logs.items()}
    summary.update(finished_runs=finished, unfinished_runs=unfinished, left_out=left_out,
                   unfinished_progress=progress)
    for name, reached in progress.items():
      log.say(f"unfinished {name}: {reached or 'no training step logged'}")
    log.say(f"{len(finished)} finished runs returned in {ARCHIVE_NAME}" +
            (f"; left out for size: {', '.join(left_out)}" if left_out else "") +
            (f"; unfinished (they start again from step 0 next time): {', '.join(unfinished)}"
             if unfinished else "."))
  log.close()
  job_output.trim_log(log.path)
  summary_path = os.path.join(out, SUMMARY_NAME)
  _write_json(summary_path, summary)  # first, so that the check counts it
  _write_json(summary_path,
              {**summary, "returned": sorted(job_output.check_returnable(out, limits))})
  for name, size in job_output.check_returnable(out, limits).items():
    print(f"gpu_job: returning {name} ({size} bytes)")


def _write_json(path: str, data: Any) -> None:
  with open(path, "w", encoding="utf-8") as f:
    json.dump(data, f, indent=1)


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
  """This program's flags, and the ARGS for the job's command."""
  parser = argparse.ArgumentParser(prog="tools/gpu_job.py", allow_abbrev=False,
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("job", choices=JOB_NAMES)
  parser.add_argument(
      "--budget_s", type=float, default=DEFAULT_BUDGET_S,
      help="seconds from start to the end of packing: the host's "
      "per-job time limit less a margin")
  parser.add_argument("--out", default=os.environ.get("OUT"), help="default: $OUT")
  parser.add_argument("--dry_run", action="store_true", help="the job at tiny size")
  parser.add_argument(
      "--wheels", default=WHEELS_DIR, help="folder of the wheels to install; "
      "'' for none (the packages installed already)")
  parser.add_argument("--site", default="/tmp/site", help="where the wheels are installed")
  parser.add_argument("--data_dir", default=DATA_DIR, help="the prepared datasets")
  parser.add_argument("--max_files", type=int, default=job_output.MAX_FILES,
                      help="files the host gives back of --out")
  parser.add_argument("--max_file_mib", type=float, default=job_output.MAX_FILE_BYTES / 2**20,
                      help="MiB of one file the host gives back")
  parser.add_argument("--max_total_mib", type=float, default=job_output.MAX_TOTAL_BYTES / 2**20,
                      help="MiB the host gives back in all")
  parser.add_argument("--max_depth", type=int, default=job_output.MAX_DEPTH,
                      help="folders below --out the host gives back")
  parser.add_argument("--results_root", default=None, help=f"default: {RESULTS_DIR}, or a "
                      "temporary folder for a dry run")
  args, extra = parser.parse_known_args(argv)
  if not args.out:
    parser.error("no output folder: set $OUT or pass --out.")
  if args.budget_s <= STOP_GRACE_S + PACK_RESERVE_S:
    parser.error(f"--budget_s={args.budget_s} leaves no time to run: it must exceed "
                 f"{STOP_GRACE_S + PACK_RESERVE_S:.0f}.")
  return args, [a for a in extra if a != "--"]


def main(argv: list[str]) -> int:
  """Runs one job (see the module docstring); returns its exit status."""
  start = time.monotonic()
  args, extra = parse_args(argv)
  temporary = args.dry_run and not args.results_root
  results_root = tempfile.mkdtemp(
      prefix="gpu_job_") if temporary else (args.results_root or RESULTS_DIR)
  job = job_spec(args.job, results_root)
  os.makedirs(args.out, exist_ok=True)
  log = Log(os.path.join(args.out, LOG_NAME))
  summary: dict[str, Any] = {
      "job": args.job, "dry_run": args.dry_run, "budget_s": args.budget_s,
      "started_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
  }
  env = job_environment(install_wheels(args.wheels, args.site, log), args.data_dir)
  summary["versions"] = check_packages(env, log)
  status = 1
  if summary["versions"] and job.needs_gpu and not args.dry_run and summary["versions"].get(
      "backend") != "gpu":
    log.say(f"jax sees no GPU (backend {summary['versions'].get('backend')}): stopping before "
            f"the job.")
  elif summary["versions"]:
    if job.table_dir:
      finished, _ = job_output.table_runs(job.table_dir)
      log.say(f"{len(finished)} runs of {job.table_dir} already finished.")
    for destination, source in job.starts_with.items():
      if not os.path.exists(destination) and os.path.exists(source):
        os.makedirs(os.path.dirname(destination), exist_ok=True)
        shutil.copyfile(source, destination)
    command = [sys.executable, *(job.dry_run_args if args.dry_run else job.args), *extra]
    log.say(f"running {' '.join(command)}")
    summary["command"] = command
    status, summary["stopped_at_budget"] = run_until(
        command, {**env, **job.env}, start + args.budget_s - STOP_GRACE_S - PACK_RESERVE_S, log)
    stopped = status or summary["stopped_at_budget"]
    if job.table_dir and stopped and job_output.table_runs(job.table_dir)[0]:
      log.say("rebuilding results.json, table.md and the plots from the finished runs.")
      run_until([sys.executable, "-c", _REBUILD, job.table_dir], env,
                time.monotonic() + PACK_RESERVE_S / 2, log, grace_s=1.0)
  summary.update(exit_status=status, wall_s=round(time.monotonic() - start, 1))
  log.say(f"exit status {status} after {summary['wall_s']} s; packing into {args.out}.")
  limits = job_output.ReturnLimits(args.max_files, int(args.max_file_mib * 2**20),
                                   int(args.max_total_mib * 2**20), args.max_depth)
  pack(job, args.out, results_root, summary, log, limits)
  if temporary:
    shutil.rmtree(results_root)
  return 0 if status == 0 else 1


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
