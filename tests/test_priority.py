"""relpos.priority: a session leader's niceness goes to its autogroup, nothing else changes."""
import os
import subprocess
import sys

import pytest

from relpos import priority


@pytest.fixture
def autogroup(tmp_path, monkeypatch):
  """A stand-in for /proc/self/autogroup with the group's niceness at 0."""
  path = tmp_path / "autogroup"
  path.write_text("/autogroup-178 nice 0\n")
  monkeypatch.setattr(priority, "AUTOGROUP", path)
  return path


def _as_process(monkeypatch, *, niceness: int, leads_session: bool):
  monkeypatch.setattr(os, "nice", lambda increment: niceness)
  monkeypatch.setattr(os, "getsid", lambda pid: os.getpid() if leads_session else 1)


def test_a_session_leader_at_niceness_19_gives_its_group_19(autogroup, monkeypatch):
  _as_process(monkeypatch, niceness=19, leads_session=True)
  assert priority.lower_session_to_own_niceness()
  assert autogroup.read_text() == "19\n"


@pytest.mark.parametrize("niceness, leads_session, group", [(19, False, "nice 0"),
                                                            (0, True, "nice 0"),
                                                            (5, True, "nice 10")])
def test_nothing_changes_from_a_shell_at_normal_niceness_or_in_a_lower_group(
    autogroup, monkeypatch, niceness, leads_session, group):
  """A process started from a shell (the shell's whole session is its group), one at normal
  priority, and one whose group is already lower than it leave the group as it is."""
  autogroup.write_text(f"/autogroup-178 {group}\n")
  _as_process(monkeypatch, niceness=niceness, leads_session=leads_session)
  assert not priority.lower_session_to_own_niceness()
  assert autogroup.read_text() == f"/autogroup-178 {group}\n"


def test_a_kernel_without_autogroups_changes_nothing(tmp_path, monkeypatch):
  monkeypatch.setattr(priority, "AUTOGROUP", tmp_path / "missing")
  _as_process(monkeypatch, niceness=19, leads_session=True)
  assert not priority.lower_session_to_own_niceness()
  assert not (tmp_path / "missing").exists()


@pytest.mark.skipif(not priority.AUTOGROUP.exists(), reason="the kernel has no autogroups")
def test_a_program_started_with_setsid_nice_runs_in_a_group_of_that_niceness():
  """The real kernel: `setsid nice -n 7 python` leads its session and its group ends at 7."""
  program = ("from relpos import priority; priority.lower_session_to_own_niceness(); "
             "print(priority.AUTOGROUP.read_text())")
  output = subprocess.run(["setsid", "nice", "-n", "7", sys.executable, "-c", program],
                          capture_output=True, text=True, check=True).stdout
  assert output.split()[-2:] == ["nice", "7"], output
