"""Tests for relpos.locks: one process per folder, and who holds a folder, read without taking
its lock. (A second training run refused on a workdir: test_reliability.py; a second table on
an output folder: test_experiments_runner.py.)"""

import os
import socket
import subprocess
import sys
import time

import pytest

from relpos import locks
from relpos import workdir_files


def test_a_second_hold_is_refused_in_one_line_naming_the_folder_and_its_holder(tmp_path):
  folder = str(tmp_path)
  with locks.hold(folder, what="output folder", busy="wait for it"):
    with pytest.raises(locks.WorkdirInUseError) as refused:
      with locks.hold(folder, what="output folder", busy="wait for it"):
        pass
  message = str(refused.value)
  assert "\n" not in message
  assert message.startswith(f"output folder {folder} is in use by process {os.getpid()} on host "
                            f"{socket.gethostname()}, started ")
  assert message.endswith(": wait for it.")


def test_holder_reads_the_lock_without_taking_it(tmp_path):
  folder = str(tmp_path)
  assert locks.holder(folder) is None  # no lock file
  with locks.hold(folder):
    held = locks.holder(folder)
    assert held.startswith(f"process {os.getpid()} on host {socket.gethostname()}, started ")
    with pytest.raises(locks.WorkdirInUseError):  # still held
      with locks.hold(folder):
        pass
  assert locks.holder(folder) is None  # the file stays, the lock is gone
  with locks.hold(folder):  # holder left nothing locked
    pass


def test_holder_without_proc_locks_asks_whether_the_recorded_process_lives(tmp_path, monkeypatch):
  monkeypatch.setattr(locks, "PROC_LOCKS", str(tmp_path / "no_such_file"))
  lock = tmp_path / workdir_files.LOCK_FILE
  this_host = socket.gethostname()
  lock.write_text(f"process {os.getpid()} on host {this_host}, started 2026-11-24 10:00:00\n")
  assert locks.holder(str(tmp_path)) == (f"process {os.getpid()} on host {this_host}, started "
                                         "2026-11-24 10:00:00")
  ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                         capture_output=True, text=True, check=True)
  lock.write_text(f"process {ended.stdout.strip()} on host {this_host}, started ...\n")
  assert locks.holder(str(tmp_path)) is None
  lock.write_text(f"process {os.getpid()} on host not-{this_host}, started ...\n")
  assert locks.holder(str(tmp_path)) is None


def test_a_waiting_hold_takes_the_lock_when_its_holder_ends_and_records_itself(tmp_path):
  folder = str(tmp_path)
  path = os.path.join(folder, workdir_files.LOCK_FILE)
  other = subprocess.Popen([
      sys.executable, "-c",
      "import fcntl, sys, time; f = open(sys.argv[1], 'a+'); fcntl.flock(f, fcntl.LOCK_EX); "
      "f.write('process 1 on host elsewhere, started then'); f.flush(); print('held', flush=True); "
      "time.sleep(1.5)", path
  ], stdout=subprocess.PIPE, text=True)
  try:
    assert other.stdout.readline().strip() == "held"
    assert locks.holder(folder) == "process 1 on host elsewhere, started then"
    started = time.monotonic()
    with locks.hold(folder, wait=True):
      assert time.monotonic() - started > 0.5  # it waited for the other process to end
      assert other.wait(timeout=10) == 0  # and it has ended
      assert locks.holder(folder).startswith(f"process {os.getpid()} on host ")
  finally:
    other.kill()
    other.wait()
  assert locks.holder(folder) is None
