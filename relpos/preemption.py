"""Stopping on a signal: SIGTERM or SIGINT (or JAX's preemption sync point on several
processes) recorded by a handler, so that the work in flight ends where it can save (training
after a step, a table between runs) instead of where the signal found it.

On several processes JAX's preemption notifier owns SIGTERM: it tells every process, and
`multihost_utils.reached_preemption_sync_point` names the step at which all of them save. A
SIGINT (Ctrl-C) is recorded here and passed on to that notifier as a SIGTERM of its own process,
so that it too stops every process at one saved step, not the one process where a
KeyboardInterrupt would leave the others waiting in a collective."""
import signal
import threading
from collections.abc import Callable, Sequence

import jax
from jax.experimental import multihost_utils


def _preemption_service() -> bool:
  """Whether JAX's preemption sync manager runs in this process (it installs the SIGTERM
  notifier; `jax.distributed.initialize` starts it unless the service is disabled)."""
  try:
    from jax._src import distributed  # pylint: disable=import-outside-toplevel
  except ImportError:
    return False
  return getattr(getattr(distributed, "global_state", None), "preemption_sync_manager",
                 None) is not None


class Preemption:
  """SIGTERM or SIGINT (or, on several processes, JAX's preemption sync point) -> save and stop.

  One process: a handler of both signals (installed from the main thread) records the signal,
  checked after every step. Several: JAX's preemption service agrees on the step at which all
  processes save; the handler takes SIGINT alone and raises SIGTERM for JAX's notifier.

  Args:
    signals: the signals handled (default SIGNALS); the others keep their handlers.
    on_signal: called with the signal's name from the handler after it is recorded (it may
      raise, to stop the work in flight at once).

  Attributes:
    signal: the name of the last signal received ("SIGTERM", "SIGINT"; on several processes
      only "SIGINT", a SIGTERM being JAX's), or None.
    count: how many of the signals were received.
    several_processes: whether JAX's sync point decides (`jax.process_count()` > 1).
  """

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self, signals: Sequence[signal.Signals] = SIGNALS,
               on_signal: Callable[[str], None] | None = None):
    self.signal: str | None = None
    self.count = 0
    self._signals = tuple(signals)
    self._on_signal = on_signal
    self._requested = threading.Event()
    self.several_processes = jax.process_count() > 1
    self._previous = {}

  def _request(self, signum: int, _) -> None:
    self.signal = signal.Signals(signum).name
    self.count += 1
    self._requested.set()
    if self.several_processes:
      signal.raise_signal(signal.SIGTERM)  # to JAX's preemption notifier: every process saves
    if self._on_signal is not None:
      self._on_signal(self.signal)

  def _handled(self) -> tuple[signal.Signals, ...]:
    """The signals this handler takes: none off the main thread (Python allows none there);
    SIGINT alone on several processes (SIGTERM is JAX's), and none there without JAX's
    preemption service (`jax_enable_preemption_service` off: no notifier would take the
    SIGTERM, whose default would end the process unsaved)."""
    if threading.current_thread() is not threading.main_thread():
      return ()
    if self.several_processes:
      if not _preemption_service():
        return ()
      return tuple(s for s in self._signals if s == signal.SIGINT)
    return self._signals

  def __enter__(self) -> "Preemption":
    self._previous = {s: signal.signal(s, self._request) for s in self._handled()}
    return self

  def __exit__(self, *exc_info) -> None:
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)

  def reached(self, step: int) -> bool:
    """Whether to save and stop after `step` (same answer on every process)."""
    if self.several_processes:
      return multihost_utils.reached_preemption_sync_point(step)
    return self._requested.is_set()
