"""Tests for relpos.experiments.children: runs as child processes, tied to the table."""

import os
import signal
import subprocess
import sys
import time

from relpos.experiments import children

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_failure_says_why_a_child_ended_without_a_result():
  assert children.failure(-signal.SIGKILL) == "killed by SIGKILL"
  assert children.failure(0) == "stopped before finishing; its checkpoint is saved"
  assert children.failure(3) == "exit status 3"


def test_environment_splits_the_memory_and_makes_the_source_importable(monkeypatch):
  monkeypatch.setenv("PYTHONPATH", "/elsewhere")
  env = children.environment(4, "/src")
  assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.225"
  assert env["PYTHONPATH"] == os.pathsep.join(["/src", "/elsewhere"])


class _Run:
  def __init__(self, name: str, log: str):
    self.name, self.log = name, log


def test_run_all_runs_each_command_at_most_n_at_once_and_reports_each_end(tmp_path, capsys):
  runs = [_Run(f"r{i}", str(tmp_path / f"r{i}" / "run.log")) for i in range(3)]
  ended = []
  stopped = children.run_all(
      runs, command=lambda run: [sys.executable, "-c", f"print('hi from {run.name}')"],
      env=dict(os.environ), parallel=2, ended=lambda run, code, done: ended.append(
          (run.name, code, done)))
  assert not stopped
  assert sorted(name for name, _, _ in ended) == ["r0", "r1", "r2"]
  assert [code for _, code, _ in ended] == [0, 0, 0] and [d for _, _, d in ended] == [1, 2, 3]
  for run in runs:
    assert f"hi from {run.name}" in open(run.log).read()
  printed = capsys.readouterr().out
  assert printed.index("started r1") < printed.index("started r2")


PARENT_OF_A_CHILD = """
import sys, time
from relpos.experiments import children, runner
run = runner.Run("ablation", "abs", 0, sys.argv[1])
child = children.start(run, [sys.executable, "-c", "import time; time.sleep(60)"], {})
print("child", child.pid, flush=True)
time.sleep(60)
"""


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
