"""Tests for relpos.experiments.children: runs as child processes, tied to the table."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import warnings

import jax
import tiny_table
from relpos.experiments import children
from relpos.experiments import runner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A stand-in child: prints its memory share, then waits for SIGTERM and exits as a run saving
# its checkpoint does.
WAITS_FOR_SIGTERM = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: (print("saved", flush=True), sys.exit(0)))
print("ready", os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"], flush=True)
time.sleep(120)
"""


def test_failure_says_why_a_child_ended_without_a_result():
  assert children.failure(-signal.SIGKILL) == "killed by SIGKILL"
  assert children.failure(0) == "stopped before finishing; its checkpoint is saved"
  assert children.failure(3) == "exit status 3"


def test_environment_splits_the_memory_and_makes_the_source_importable(monkeypatch):
  monkeypatch.setenv("PYTHONPATH", "/elsewhere")
  env = children.environment(4, "/src")
  assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.225"
  assert env["PYTHONPATH"] == os.pathsep.join(["/src", "/elsewhere"])


def test_the_table_leaves_the_accelerator_to_its_children(monkeypatch):
  """With --parallel > 1 the table's own JAX calls (locks, the environment record) preallocate
  nothing; each child preallocates its share, or as the user's environment says."""
  monkeypatch.delenv(children.PREALLOCATE, raising=False)
  monkeypatch.setattr(children, "_USERS_PREALLOCATE", None)
  children.free_accelerator_memory()
  assert os.environ[children.PREALLOCATE] == "false"
  assert children.PREALLOCATE not in children.environment(2, "/src")  # XLA's default: true
  monkeypatch.setattr(children, "_USERS_PREALLOCATE", "false")  # the user's choice stays
  assert children.environment(2, "/src")[children.PREALLOCATE] == "false"


class _Run:
  def __init__(self, name: str, log: str):
    self.name, self.log = name, log


# A stand-in child that runs 0.8 s, then writes when it started and ended to argv[1].
TIMED = """
import sys, time
started = time.monotonic()
print("hi from", sys.argv[2], flush=True)
time.sleep(0.8)
with open(sys.argv[1], "w") as f:
  f.write(f"{started} {time.monotonic()}")
"""


def _most_at_once(intervals: list[tuple[float, float]]) -> int:
  """The most of the (start, end) intervals that overlap at any time."""
  events = sorted([(end, -1) for _, end in intervals] + [(start, 1) for start, _ in intervals])
  running = most = 0
  for _, change in events:  # at a tie, an end before a start
    running += change
    most = max(most, running)
  return most


def test_run_all_runs_each_command_at_most_n_at_once_and_reports_each_end(
    tmp_path, capsys, monkeypatch):
  monkeypatch.setattr(children, "POLL_SECONDS", 0.05)
  runs = [_Run(f"r{i}", str(tmp_path / f"r{i}" / "run.log")) for i in range(3)]
  times = {run.name: tmp_path / f"{run.name}.times" for run in runs}
  ended = []
  stopped = children.run_all(
      runs, command=lambda run: [sys.executable, "-c", TIMED,
                                 str(times[run.name]), run.name], env=dict(os.environ), parallel=2,
      ended=lambda run, code, done: ended.append((run.name, code, done)))
  assert not stopped
  assert sorted(name for name, _, _ in ended) == ["r0", "r1", "r2"]
  assert [code for _, code, _ in ended] == [0, 0, 0] and [d for _, _, d in ended] == [1, 2, 3]
  for run in runs:
    assert f"hi from {run.name}" in open(run.log).read()
  printed = capsys.readouterr().out
  assert printed.index("started r1") < printed.index("started r2")
  intervals = {name: tuple(map(float, path.read_text().split())) for name, path in times.items()}
  assert _most_at_once(list(intervals.values())) == 2  # two at once, never three
  assert intervals["r2"][0] > min(intervals["r0"][1], intervals["r1"][1])  # once one ended


def test_a_signal_stops_the_children_and_data_is_prepared_before_them(tmp_path, monkeypatch,
                                                                      capsys):
  output_dir, data_dir = str(tmp_path / "out"), str(tmp_path / "tfds")

  def stand_in(run, task, overrides):
    if run.row == "none":
      return [sys.executable, "-c", "import sys; sys.exit('none failed')"]
    return [sys.executable, "-c", WAITS_FOR_SIGTERM]

  def logs(rows):
    return [
        os.path.join(output_dir, "runs", f"synthetic-ablation-{row}-seed0", "run.log")
        for row in rows
    ]

  def terminate_when_ready():
    for _ in range(600):
      if all(os.path.exists(p) and "ready" in open(p).read() for p in logs(["abs", "rel_kv"])):
        os.kill(os.getpid(), signal.SIGTERM)
        return
      time.sleep(0.1)

  monkeypatch.setattr(runner, "child_command", stand_in)
  handler = signal.getsignal(signal.SIGTERM)
  threading.Thread(target=terminate_when_ready, daemon=True).start()
  outputs = runner.run_table("ablation", task="synthetic", seeds=[0], output_dir=output_dir,
                             rows=["none", "abs",
                                   "rel_kv"], parallel=2, overrides=tiny_table.overrides(data_dir))
  printed = capsys.readouterr().out
  assert outputs["preempted"] and outputs["failed"] == [
      f"synthetic-ablation-none-seed0: see {logs(['none'])[0]}"
  ]
  assert "run 1 of 3 failed: synthetic-ablation-none-seed0 (exit status 1); log: " in printed
  assert "none failed" in open(logs(["none"])[0]).read()
  # two at once: rel_kv started only when none had ended
  assert (printed.index("failed: synthetic-ablation-none")
          < printed.index("started synthetic-ablation-rel_kv"))
  for log in logs(["abs", "rel_kv"]):
    assert "ready 0.450" in open(log).read() and "saved" in open(log).read()
  assert "stopping synthetic-ablation-abs-seed0, synthetic-ablation-rel_kv-seed0" in printed
  assert signal.getsignal(signal.SIGTERM) is handler
  with open(os.path.join(output_dir, "results.json")) as f:
    assert json.load(f)["runs"] == []
  # the children were stand-ins: the parent prepared the dataset and the tokenizer
  assert os.listdir(os.path.join(data_dir, "synthetic_translation"))
  assert os.listdir(os.path.join(data_dir, "relpos_tokenizers"))


PARENT_OF_A_CHILD = """
import sys, time
from relpos.experiments import children, runner
run = runner.Run("ablation", "abs", 0, sys.argv[1])
child = children.start(run, [sys.executable, "-c", "import time; time.sleep(60)"], {})
print("child", child.pid, flush=True)
time.sleep(60)
"""


def test_a_child_starts_without_jaxs_fork_warning(tmp_path):
  """With JAX's threads running, a tie set between fork and exec made JAX warn "os.fork() was
  called ... will likely lead to a deadlock" at every child's start."""
  assert jax.devices()  # JAX's backend (and its fork warning) set up in this process
  run = runner.Run("ablation", "abs", 0, str(tmp_path / "w"))
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    child = children.start(run, [sys.executable, "-c", "print('ran', flush=True)"], {})
    assert child.wait(timeout=30) == 0
  assert not [w for w in caught if "fork" in str(w.message)], [str(w.message) for w in caught]
  with open(run.log, encoding="utf-8") as log:
    assert log.read().splitlines()[-1] == "ran"


def test_a_child_dies_with_its_table_killed_outright(tmp_path):
  parent = subprocess.Popen([sys.executable, "-c", PARENT_OF_A_CHILD,
                             str(tmp_path / "w")], cwd=ROOT, stdout=subprocess.PIPE, text=True)
  child = int(next(line for line in parent.stdout if line.startswith("child ")).split()[1])
  parent.kill()
  parent.wait()
  deadline = time.monotonic() + 10
  while time.monotonic() < deadline and _alive(child):
    time.sleep(0.1)
  assert not _alive(child)


def _alive(pid: int) -> bool:
  """Whether `pid` is a live (not zombie) process."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().split(") ")[1][0] != "Z"
  except FileNotFoundError:
    return False
