"""Tests for relpos.preemption: signals recorded, counted, passed to a callback, and the
previous handlers put back."""
import os
import signal

import pytest

from relpos import preemption


def test_a_signal_is_recorded_counted_and_the_handlers_put_back():
  before = {s: signal.getsignal(s) for s in preemption.Preemption.SIGNALS}
  with preemption.Preemption() as stop:
    assert not stop.reached(1) and stop.signal is None and stop.count == 0
    os.kill(os.getpid(), signal.SIGTERM)
    assert stop.reached(2) and stop.signal == "SIGTERM" and stop.count == 1
    os.kill(os.getpid(), signal.SIGINT)  # no KeyboardInterrupt: recorded
    assert stop.signal == "SIGINT" and stop.count == 2
  assert {s: signal.getsignal(s) for s in preemption.Preemption.SIGNALS} == before


def test_only_the_chosen_signals_and_the_callback_may_stop_the_work_at_once():
  class Stop(Exception):
    pass

  def stop_now(name: str) -> None:
    raise Stop(name)

  # What the process inherited (a command started with `&` from a script ignores SIGINT).
  sigint, sigterm = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
  with pytest.raises(Stop, match="SIGTERM"):
    with preemption.Preemption(signals=(signal.SIGTERM,), on_signal=stop_now):
      assert signal.getsignal(signal.SIGINT) is sigint
      os.kill(os.getpid(), signal.SIGTERM)
  assert signal.getsignal(signal.SIGTERM) is sigterm


def test_on_several_processes_sigint_becomes_jax_s_sigterm(monkeypatch):
  """JAX's preemption notifier owns SIGTERM there (here a recorder stands in for it): SIGINT is
  recorded and raised again as SIGTERM, for the sync point to stop every process at one step."""
  monkeypatch.setattr(preemption.jax, "process_count", lambda: 2)
  monkeypatch.setattr(preemption, "_preemption_service", lambda: True)
  monkeypatch.setattr(preemption.multihost_utils, "reached_preemption_sync_point",
                      lambda step: step >= 7)
  notified = []
  notifier = lambda signum, _: notified.append(signum)
  sigterm = signal.signal(signal.SIGTERM, notifier)
  try:
    with preemption.Preemption() as stop:
      assert stop.several_processes and not stop.reached(6)
      assert signal.getsignal(signal.SIGTERM) is notifier  # JAX's, untouched
      os.kill(os.getpid(), signal.SIGINT)  # no KeyboardInterrupt: recorded, passed on
      assert stop.signal == "SIGINT" and notified == [signal.SIGTERM]
      assert stop.reached(7)
  finally:
    signal.signal(signal.SIGTERM, sigterm)


def test_without_jax_s_preemption_service_sigint_is_left_alone(monkeypatch):
  """No notifier would take a SIGTERM (its default ends the process unsaved): Ctrl-C keeps
  Python's KeyboardInterrupt."""
  monkeypatch.setattr(preemption.jax, "process_count", lambda: 2)
  assert not preemption._preemption_service()  # pylint: disable=protected-access
  sigint = signal.getsignal(signal.SIGINT)
  with preemption.Preemption():
    assert signal.getsignal(signal.SIGINT) is sigint
