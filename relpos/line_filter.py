"""Drops whole lines that start with given prefixes from a stream's file descriptor, so that
what C++ code prints straight to stdout or stderr (past Python's logging) is filtered too."""
import atexit
import os
import threading
from collections.abc import Sequence
from typing import TextIO


def drop_lines(data: bytes, held: bytes, at_line_start: bool,
               prefixes: Sequence[bytes]) -> tuple[bytes, bytes, bool]:
  """One step of a stream filter that drops whole lines starting with one of `prefixes`.

  Args:
    data: the bytes just written.
    held: the bytes the previous step held back (b"" at first).
    at_line_start: whether `held + data` starts a line (True at first).
    prefixes: the starts of the lines to drop.

  Returns:
    (the bytes to pass on now; the bytes to hold back: the start of a line that is, or may
    still become, a dropped one; whether what comes next starts a line). Everything else
    passes at once, so a progress bar redrawn with "\r" is not delayed.
  """
  text, out, start = held + data, bytearray(), 0
  while start < len(text):
    end = text.find(b"\n", start)
    line = text[start:] if end < 0 else text[start:end + 1]
    if at_line_start and end < 0 and any(
        line.startswith(p) or p.startswith(line) for p in prefixes):
      return bytes(out), line, True
    if not (at_line_start and any(line.startswith(p) for p in prefixes)):
      out += line
    at_line_start = end >= 0
    start += len(line)
  return bytes(out), b"", at_line_start


class LineFilter:
  """Drops, from everything written to a stream's file descriptor (by C++ code too), the lines
  that start with one of `prefixes`: the descriptor becomes a pipe that a thread copies to the
  original through `drop_lines`. At exit the original is put back and the pipe drained."""
  def __init__(self, stream: TextIO, prefixes: Sequence[bytes]):
    self._stream = stream
    self._fd = stream.fileno()
    self._prefixes = tuple(prefixes)
    stream.flush()
    self._original = os.dup(self._fd)
    read_end, write_end = os.pipe()
    os.dup2(write_end, self._fd)
    os.close(write_end)
    self._read_end = read_end
    self._thread = threading.Thread(target=self._copy, name="line-filter", daemon=True)
    self._thread.start()
    atexit.register(self.close)

  def _copy(self) -> None:
    held, at_line_start = b"", True
    while data := os.read(self._read_end, 1 << 16):
      out, held, at_line_start = drop_lines(data, held, at_line_start, self._prefixes)
      if out:
        os.write(self._original, out)
    if held and not any(held.startswith(p) for p in self._prefixes):
      os.write(self._original, held)  # an unended line at exit that was not a dropped one
    os.close(self._read_end)

  def close(self) -> None:
    """Puts the original descriptor back and waits for the pipe to drain."""
    if not self._stream.closed:
      self._stream.flush()
    os.dup2(self._original, self._fd)  # closes the pipe's write end: the thread sees its end
    self._thread.join(timeout=5)
