"""A program started at low priority (`setsid nice -n 19 ...`) stays low against other sessions.

Linux's autogroup scheduling (on by default in most distributions' kernels:
/proc/sys/kernel/sched_autogroup_enabled) shares the CPU between sessions first and only then
between the processes of a session by their niceness. A table started detached with `setsid`
is a session of its own, so `nice -n 19` ranked it against nothing: on 2 cores it took a full
core beside a test run started from a shell, instead of yielding it. The niceness of a session's
autogroup (/proc/self/autogroup) is what ranks it against other sessions.
"""
import os
import pathlib

AUTOGROUP = pathlib.Path("/proc/self/autogroup")


def lower_session_to_own_niceness() -> bool:
  """Gives this process's session group its niceness, when it leads its session (was started
  with `setsid`) and runs at a niceness above its group's: its children share the group and
  nothing else does. A process that does not lead its session (one started from a shell, whose
  group holds the shell and every job in it) changes nothing.

  Returns:
    Whether the group's niceness was raised; False also where the kernel has no autogroups.
  """
  niceness = os.nice(0)
  if niceness <= 0 or os.getsid(0) != os.getpid():
    return False
  try:
    group_niceness = int(AUTOGROUP.read_text().split()[-1])  # "/autogroup-178 nice 0"
    if group_niceness >= niceness:
      return False
    AUTOGROUP.write_text(f"{niceness}\n")
  except (OSError, ValueError, IndexError):
    return False
  return True
