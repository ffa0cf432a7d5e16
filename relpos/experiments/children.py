"""Runs of a table as child processes, up to N at once (`run --parallel=N`).

Each child runs one command with its output appended to its run's log, in a session of its own
(a terminal's Ctrl-C reaches only the table, which stops the children so that they save), and
tied to the table before the command starts (`PR_SET_PDEATHSIG`, `relpos.experiments.tied`): a
table killed outright leaves no run training. SIGINT or SIGTERM to the table stops the children
(each saves a checkpoint); a second one kills them.

A run is any object with `name` (str) and `log` (the file its child writes to).
"""

import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from relpos import preemption
from relpos.experiments import tied

# The share of the accelerator's memory the children split evenly.
MEMORY_FRACTION = 0.9
POLL_SECONDS = 0.5
# XLA's preallocation switch as the user's environment set it (before `free_accelerator_memory`
# changed this process's): the children get it back.
PREALLOCATE = "XLA_PYTHON_CLIENT_PREALLOCATE"
_USERS_PREALLOCATE = os.environ.get(PREALLOCATE)


def free_accelerator_memory() -> None:
  """Keeps this process, the table's (with --parallel > 1 it trains nothing), from reserving
  the accelerator's memory: XLA preallocates 75% of a GPU's at a process's first JAX call (a
  lock, the environment record), and the children, each preallocating its share
  (`environment`), would then start out of memory. Call before any JAX call."""
  os.environ[PREALLOCATE] = "false"


def environment(parallel: int, source_root: str) -> dict[str, str]:
  """This process's environment with `source_root` importable and
  XLA_PYTHON_CLIENT_MEM_FRACTION set to MEMORY_FRACTION / parallel.

  XLA still preallocates each child's share at its start, so the shares are fixed: a child
  that needs more fails with an out-of-memory error naming itself instead of starving the
  others (XLA_PYTHON_CLIENT_PREALLOCATE=false would let them grow into each other, and
  fragment). On CPU the variable changes nothing.
  """
  env = dict(os.environ)
  env.pop(PREALLOCATE, None)  # the user's own, not the table's (`free_accelerator_memory`)
  if _USERS_PREALLOCATE is not None:
    env[PREALLOCATE] = _USERS_PREALLOCATE
  env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{MEMORY_FRACTION / parallel:.3f}"
  env["PYTHONPATH"] = os.pathsep.join(p for p in (source_root, env.get("PYTHONPATH")) if p)
  return env


def start(run: Any, command: list[str], env: dict[str, str]) -> subprocess.Popen:
  """Starts `command` as `run`'s child process (see the module docstring)."""
  os.makedirs(os.path.dirname(run.log), exist_ok=True)
  with open(run.log, "a", encoding="utf-8") as log:
    log.write(f"relpos: {time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(command)}\n")
    log.flush()
    if sys.platform.startswith("linux"):  # the kernel's tie exists there only
      command = [sys.executable, tied.__file__, str(os.getpid()), *command]
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log,
                               stderr=subprocess.STDOUT, env=env, start_new_session=True)
  print(f"relpos: started {run.name} (log: {run.log})", flush=True)
  return process


def failure(returncode: int) -> str:
  """Why a child process that wrote no result ended."""
  if returncode < 0:
    return f"killed by {signal.Signals(-returncode).name}"
  if returncode == 0:
    return "stopped before finishing; its checkpoint is saved"
  return f"exit status {returncode}"


def _stop(running: dict[subprocess.Popen, Any], signals: preemption.Preemption) -> None:
  """SIGTERM to every running child (each saves a checkpoint and exits), then waits for them;
  one more SIGINT or SIGTERM meanwhile kills them."""
  if not running:
    return
  print(
      f"relpos: stopping {', '.join(run.name for run in running.values())}; rerun the same "
      "command to resume.", flush=True)
  received = signals.count
  for process in running:
    process.terminate()
  while any(process.poll() is None for process in running):
    if signals.count > received:
      for process in running:
        process.kill()
    time.sleep(POLL_SECONDS)


def run_all(runs: Sequence[Any], *, command: Callable[[Any], list[str]], env: dict[str, str],
            parallel: int, ended: Callable[[Any, int, int], None]) -> bool:
  """Runs `command(run)` for every run as a child process, up to `parallel` at once.

  Args:
    runs: the runs, started in order.
    command: the command line of a run's child.
    env: the children's environment (`environment`).
    parallel: how many at once.
    ended: called as ended(run, its child's return code, how many runs have ended) for each.

  Returns:
    Whether SIGINT or SIGTERM stopped them (the running ones saved and the rest not started).
  """
  waiting, running, done = list(runs), {}, 0
  with preemption.Preemption() as signals:
    try:
      while (waiting or running) and not signals.count:
        while waiting and len(running) < parallel:
          run = waiting.pop(0)
          running[start(run, command(run), env)] = run
        time.sleep(POLL_SECONDS)
        for process in [p for p in running if p.poll() is not None]:
          done += 1
          ended(running.pop(process), process.returncode, done)
    finally:
      _stop(running, signals)
  return signals.count > 0
