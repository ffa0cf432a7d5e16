"""Stopping on a signal: SIGTERM or SIGINT (or JAX's preemption sync point on several
processes) recorded by a handler, so that the work in flight ends where it can save (training
after a step, a table between runs) instead of where the signal found it."""
import signal
import threading
from collections.abc import Callable, Sequence

import jax
from jax.experimental import multihost_utils


class Preemption:
  """SIGTERM or SIGINT (or, on several processes, JAX's preemption sync point) -> save and stop.

  One process: a handler of both signals (installed from the main thread) records the signal,
  checked after every step. Several: JAX's preemption service agrees on the step at which all
  processes save.

  Args:
    signals: the signals handled (default SIGNALS); the others keep their handlers.
    on_signal: called with the signal's name from the handler after it is recorded (it may
      raise, to stop the work in flight at once).

  Attributes:
    signal: the name of the last signal received ("SIGTERM", "SIGINT"), or None.
    count: how many of the signals were received.
  """

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self, signals: Sequence[signal.Signals] = SIGNALS,
               on_signal: Callable[[str], None] | None = None):
    self.signal: str | None = None
    self.count = 0
    self._signals = tuple(signals)
    self._on_signal = on_signal
    self._requested = threading.Event()
    self._handles_signal = (jax.process_count() == 1 and
                            threading.current_thread() is threading.main_thread())
    self._previous = {}

  def _request(self, signum: int, _) -> None:
    self.signal = signal.Signals(signum).name
    self.count += 1
    self._requested.set()
    if self._on_signal is not None:
      self._on_signal(self.signal)

  def __enter__(self) -> "Preemption":
    if self._handles_signal:
      self._previous = {s: signal.signal(s, self._request) for s in self._signals}
    return self

  def __exit__(self, *exc_info) -> None:
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)

  def reached(self, step: int) -> bool:
    """Whether to save and stop after `step` (same answer on every process)."""
    if jax.process_count() > 1:
      return multihost_utils.reached_preemption_sync_point(step)
    return self._requested.is_set()
