"""The source tree relpos runs from: its folder and the commit a process loaded."""
import functools
import os
import subprocess

# The source tree's root (where `relpos` and `configs` are imported from).
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@functools.cache
def commit() -> str:
  """The source tree's short commit, with `-dirty` when it has uncommitted changes to tracked
  files; "unknown" outside a git checkout.

  Read once per process (programs read it at start-up, `cli.start`): the code a process runs is
  the code it loaded then, whatever the tree holds later.
  """
  try:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                           check=True, capture_output=True, text=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown"
  return head + ("-dirty" if dirty else "")
