"""Tests for tools/gpu_job.py: a table job's dry run end to end and resumed, stopping at the
time budget, its flags and return limits (the packing itself: tests/test_job_output.py)."""

import json
import os
import subprocess
import sys
import tarfile
import time

import pytest

from relpos import run_config
from relpos.experiments import tables
from tools import gpu_job
from tools import job_output

RUN = "synthetic-ablation-abs-seed0"


def dry_run(tmp_path, results_root: str) -> tuple[subprocess.CompletedProcess, str]:
  """The synthetic ablation job at tiny size, without wheels; returns (process, $OUT)."""
  out = str(tmp_path / "out")
  command = [
      sys.executable,
      os.path.join(gpu_job.ROOT, "tools", "gpu_job.py"), "synthetic_ablation", "--dry_run",
      "--budget_s=400", f"--out={out}", "--wheels=", f"--data_dir={tmp_path / 'data'}",
      f"--results_root={results_root}", "--", "--seeds=1"
  ]
  return subprocess.run(command, capture_output=True, text=True, check=False), out


def test_dry_run_packs_a_finished_table_that_the_next_job_continues(tmp_path):
  done, out = dry_run(tmp_path, str(tmp_path / "results"))
  assert done.returncode == 0, done.stdout[-3000:]
  returned = job_output.check_returnable(out)
  assert set(returned) == {"job.log", "job.json", "results.tar.gz", "results.json", "table.md"}
  with open(os.path.join(out, "job.json"), encoding="utf-8") as f:
    summary = json.load(f)
  assert summary["exit_status"] == 0 and not summary["stopped_at_budget"]
  assert summary["finished_runs"] == [RUN] and summary["unfinished_runs"] == []
  assert summary["command"][-1] == "--seeds=1" and summary["versions"]["packages"]["jax"]
  assert summary["returned"] == sorted(returned)
  with open(os.path.join(out, "results.json"), encoding="utf-8") as f:
    assert [r["row"] for r in json.load(f)["runs"]] == ["abs"]
  with tarfile.open(os.path.join(out, "results.tar.gz")) as archive:
    names = archive.getnames()
    assert "synthetic_ablation/table.md" in names
    assert not [n for n in names if "checkpoints" in n]
    archive.extractall(tmp_path / "carried", filter="data")  # the next job's bundle/results
  # The next job's runner skips the runs that hold a result.json.
  assert job_output.table_runs(str(tmp_path / "carried" / "synthetic_ablation")) == ([RUN], [])


def test_run_until_stops_the_job_at_the_deadline(tmp_path):
  log = gpu_job.Log(str(tmp_path / "job.log"))
  saves = ("import signal, sys, time\n"
           "signal.signal(signal.SIGTERM, lambda *_: (print('saved', flush=True), sys.exit(0)))\n"
           "print('started', flush=True)\n"
           "time.sleep(60)\n")
  status, stopped = gpu_job.run_until([sys.executable, "-c", saves], dict(os.environ),
                                      time.monotonic() + 2, log, grace_s=20)
  assert (status, stopped) == (0, True)
  ignores = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
  start = time.monotonic()
  status, stopped = gpu_job.run_until([sys.executable, "-c", ignores], dict(os.environ),
                                      time.monotonic() + 1, log, grace_s=1)
  assert (status, stopped) == (-9, True) and time.monotonic() - start < 20
  log.close()
  text = open(log.path, encoding="utf-8").read()
  assert "started\n" in text and "saved\n" in text and "SIGKILL.\n" in text


def test_the_return_limits_are_options(tmp_path):
  args, _ = gpu_job.parse_args(
      ["tests", f"--out={tmp_path}", "--max_files=2", "--max_file_mib=0.5", "--max_depth=0"])
  assert (args.max_files, args.max_file_mib, args.max_depth) == (2, 0.5, 0)
  for name in ("a.txt", "b.txt", "c.txt"):
    (tmp_path / name).write_text("x")
  with pytest.raises(ValueError, match="3 files, over 2"):
    job_output.check_returnable(str(tmp_path), job_output.ReturnLimits(files=2))
  (tmp_path / "c.txt").unlink()
  assert len(job_output.check_returnable(str(tmp_path), job_output.ReturnLimits(files=2))) == 2


def test_job_flags_and_the_arguments_passed_on(tmp_path):
  args, extra = gpu_job.parse_args(
      ["multi30k_k_sweep", f"--out={tmp_path}", "--parallel=2", "--", "--seeds=3"])
  assert args.job == "multi30k_k_sweep" and args.budget_s == gpu_job.DEFAULT_BUDGET_S
  assert extra == ["--parallel=2", "--seeds=3"]
  job = gpu_job.job_spec(args.job, "/results")
  assert "--table=k_sweep" in job.args and "--output_dir=/results/multi30k_k_sweep" in job.args
  assert job.table_dir == "/results/multi30k_k_sweep"
  with pytest.raises(ValueError, match="unknown job 'wmt14_ablation'"):
    gpu_job.job_spec("wmt14_ablation", "/results")


def test_the_gpu_recipe_jobs_run_its_task():
  job = gpu_job.job_spec("multi30k_gpu_ablation", "/results")
  assert "--task=multi30k_gpu" in job.args and "--table=ablation" in job.args
  assert job.table_dir == "/results/multi30k_gpu_ablation"


@pytest.mark.parametrize("name", [n for n in gpu_job.JOB_NAMES if n.endswith(gpu_job.TABLES)])
def test_every_table_jobs_dry_run_settings_validate(name):
  """The dry run of each table job is a config validation accepts (the GPU recipe's
  average:10 needs 10 checkpoints saved, more than a 2-step run saves)."""
  job = gpu_job.job_spec(name, "/results")
  task = next(a.split("=", 1)[1] for a in job.args if a.startswith("--task="))
  row = next(a.split("=", 1)[1] for a in job.dry_run_args if a.startswith("--rows="))
  overrides = dict(
      tables.parse_override(a.split("=", 1)[1]) for a in job.dry_run_args if a.startswith("--set="))
  run_config.validate(tables.one_run_config(row, 0, task, overrides))


def test_a_job_for_the_gpu_stops_before_its_command_where_jax_sees_none(tmp_path):
  out = tmp_path / "out"
  done = subprocess.run([
      sys.executable,
      os.path.join(gpu_job.ROOT, "tools", "gpu_job.py"), "benchmarks", "--budget_s=200",
      f"--out={out}", "--wheels=", f"--results_root={tmp_path / 'results'}"
  ], capture_output=True, text=True, check=False)
  assert done.returncode == 1
  summary = json.loads((out / gpu_job.SUMMARY_NAME).read_text())
  assert summary["versions"]["backend"] == "cpu" and "command" not in summary
  assert "jax sees no GPU (backend cpu): stopping before the job." in (
      out / gpu_job.LOG_NAME).read_text()


def test_the_run_in_flight_at_parallel_1_reports_its_progress_from_the_job_log(tmp_path):
  """With --parallel=1 a run writes no run.log: its progress bar is in the job's log."""
  table_dir = tmp_path / "results" / "multi30k_gpu_ablation"
  (table_dir / "runs" / "multi30k_gpu-ablation-abs-seed0").mkdir(parents=True)
  out = tmp_path / "out"
  out.mkdir()
  log = gpu_job.Log(str(out / gpu_job.LOG_NAME))
  log.write(b"\r 5%|#  | 400/8000 [03:20<1:03:20, 2.00step/s, loss=4.1]")
  summary = {}
  gpu_job.pack(gpu_job.job_spec("multi30k_gpu_ablation", str(tmp_path / "results")), str(out),
               str(tmp_path / "results"), summary, log)
  assert summary["unfinished_progress"] == {
      "multi30k_gpu-ablation-abs-seed0": "step 400 of 8000, 2 steps/s"
  }
