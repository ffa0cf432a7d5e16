"""Tests for relpos.experiments.tied: the command runs in the same process, tied to its parent
(its death by the parent's end: tests/test_experiments_children.py)."""
import os
import subprocess
import sys

from relpos.experiments import tied

PRINTS_ITS_ARGUMENTS = "import os, sys; print(os.getpid(), sys.argv[1:]); sys.exit(3)"


def test_the_command_replaces_the_process_with_its_arguments_and_exit_status():
  process = subprocess.Popen([
      sys.executable, tied.__file__,
      str(os.getpid()), sys.executable, "-c", PRINTS_ITS_ARGUMENTS, "a b", "--c"
  ], stdout=subprocess.PIPE, text=True)
  output, _ = process.communicate(timeout=60)
  assert process.returncode == 3
  assert output.split(" ", 1) == [str(process.pid), "['a b', '--c']\n"]  # exec, not a child


def test_a_parent_already_gone_stops_it_before_the_command(tmp_path):
  marker = tmp_path / "ran"
  done = subprocess.run(
      [sys.executable, tied.__file__, "1", sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
      check=False)  # its parent is this process, not process 1
  assert done.returncode == 1
  assert not marker.exists()
