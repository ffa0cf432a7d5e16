"""Tests for tools/gpu_job.py: a table job's dry run end to end and resumed, stopping at the
time budget, and packing within what the GPU host gives back."""

import json
import os
import subprocess
import sys
import tarfile
import time

import pytest

from tools import gpu_job

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
  returned = gpu_job.check_returnable(out)
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
  assert gpu_job.table_runs(str(tmp_path / "carried" / "synthetic_ablation")) == ([RUN], [])


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


def test_run_progress_reads_the_last_progress_bar_of_a_run_log(tmp_path):
  log = tmp_path / "run.log"
  log.write_bytes(b"\r  0%|   | 0/8000 [00:00<?, ?step/s]\r 68%|###   | 5434/8000 [07:15<03:25, "
                  b"12.45step/s]\r 68%|###   | 5435/8000 [07:16<03:25, 12.46step/s, loss=1.58]"
                  b"\nW1123 train.py:728] Preempted: saved step 5435\n")
  assert gpu_job.run_progress(str(log)) == "step 5435 of 8000, 12.46 steps/s"
  log.write_bytes(b"\r  0%|   | 1/8000 [00:42<93:23:06, 40.00s/step]\nerror: non-finite\n")
  assert gpu_job.run_progress(str(log)) == "step 1 of 8000, 0.025 steps/s"
  log.write_bytes(b"error: the config is wrong\n")
  assert gpu_job.run_progress(str(log)) is None
  assert gpu_job.run_progress(str(tmp_path / "missing.log")) is None


def test_write_archive_leaves_out_the_largest_files_until_it_fits(tmp_path):
  sizes = {"small.json": 1000, "large.bin": 200_000, "medium.bin": 50_000}
  for name, size in sizes.items():
    (tmp_path / name).write_bytes(os.urandom(size))
  archive = str(tmp_path / "out.tar.gz")
  left_out = gpu_job.write_archive([str(tmp_path / n) for n in sizes], str(tmp_path), archive,
                                   limit=100_000)
  assert left_out == ["large.bin"] and os.path.getsize(archive) <= 100_000
  with tarfile.open(archive) as f:
    assert sorted(f.getnames()) == ["medium.bin", "small.json"]


def test_trim_log_keeps_head_and_tail_within_the_limit(tmp_path):
  path = tmp_path / "job.log"
  path.write_bytes(b"head" + b"x" * 10_000 + b"tail")
  gpu_job.trim_log(str(path), limit=1000, head=100)
  data = path.read_bytes()
  assert len(data) == 1000 and data.startswith(b"head") and data.endswith(b"tail")
  assert b"bytes of log left out here" in data


@pytest.mark.parametrize("files, message", [
    ([f"f{i}" for i in range(9)], "9 files, over 8"),
    (["bad name.txt"], "only letters"),
    (["a/b/c/deep.txt"], "more than 2 folders"),
])
def test_check_returnable_names_what_would_not_come_back(tmp_path, files, message):
  for name in files:
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text("x")
  with pytest.raises(ValueError, match=message):
    gpu_job.check_returnable(str(tmp_path))


def test_check_returnable_refuses_a_file_over_16_mib(tmp_path):
  (tmp_path / "big.bin").write_bytes(b"\0" * (gpu_job.MAX_FILE_BYTES + 1))
  with pytest.raises(ValueError, match="big.bin: .* bytes, over"):
    gpu_job.check_returnable(str(tmp_path))


def test_the_return_limits_are_options(tmp_path):
  args, _ = gpu_job.parse_args(
      ["tests", f"--out={tmp_path}", "--max_files=2", "--max_file_mib=0.5", "--max_depth=0"])
  assert (args.max_files, args.max_file_mib, args.max_depth) == (2, 0.5, 0)
  for name in ("a.txt", "b.txt", "c.txt"):
    (tmp_path / name).write_text("x")
  with pytest.raises(ValueError, match="3 files, over 2"):
    gpu_job.check_returnable(str(tmp_path), gpu_job.ReturnLimits(files=2))
  (tmp_path / "c.txt").unlink()
  assert len(gpu_job.check_returnable(str(tmp_path), gpu_job.ReturnLimits(files=2))) == 2


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
