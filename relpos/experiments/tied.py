"""`python relpos/experiments/tied.py PARENT COMMAND...`: COMMAND in this process, tied to the
process PARENT (Linux): the kernel sends it SIGTERM when PARENT ends, however it ends, and it
exits at once (status 1) when PARENT already has.

A table starts each child run through it (`relpos.experiments.children.start`). The tie is set
here, after exec, not between fork and exec (`subprocess.Popen(preexec_fn=...)`): Python code
in a forked copy of a process running JAX's threads can deadlock, and JAX said so on every
child's start ("RuntimeWarning: os.fork() was called ... will likely lead to a deadlock").
Standard library only: it starts in milliseconds and imports nothing of the table.
"""
import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1  # prctl option (linux/prctl.h); kept across exec


def main(argv: list[str]) -> None:
  """Ties this process to argv[1] and replaces it with the command argv[2:]."""
  parent, command = int(argv[1]), argv[2:]
  ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
  if os.getppid() != parent:  # ended before the tie: nobody would stop this run
    os._exit(1)
  os.execvp(command[0], command)


if __name__ == "__main__":
  main(sys.argv)
