"""Tests for relpos.distributed: joining a multi-process run (tests/test_reliability.py runs
two processes through it)."""
import re

import numpy as np
import pytest

from relpos import distributed


def test_one_process_needs_nothing(monkeypatch):
  def must_not_run(*args, **kwargs):
    raise AssertionError("called for one process")

  monkeypatch.setattr(distributed.jax.distributed, "initialize", must_not_run)
  monkeypatch.setattr(distributed.line_filter, "LineFilter", must_not_run)
  distributed.initialize("")  # returns at once: no coordinator, no line filter


@pytest.mark.parametrize("multihost", ["localhost:1234", "localhost:1234,two,0", "a,1,2,3"])
def test_a_malformed_multihost_is_one_line_naming_it(multihost):
  with pytest.raises(ValueError) as raised:
    distributed.initialize(multihost)
  assert str(raised.value) == (f"--multihost={multihost!r}: must be 'auto' or "
                               "'<host:port>,<num_processes>,<process_id>'.")


def test_the_noise_is_gloos_connection_lines():
  assert distributed.NOISE_LINE_PREFIXES == (b"[Gloo] Rank ",)


@pytest.mark.parametrize("multihost,says", [
    ("localhost:abc,1,0", "must be 'auto' or"),
    ("localhost:0,1,0", "the port 0 is not in 1-65535."),
    ("localhost:1234,2,5", "the process id 5 must be below the number of processes 2."),
    ("localhost:1234,0,0", "the number of processes must be at least 1."),
])
def test_a_port_or_process_id_that_cannot_be_is_one_line_before_joining(
    monkeypatch, multihost, says):
  monkeypatch.setattr(distributed.jax.distributed, "initialize", _must_not_join)
  with pytest.raises(ValueError, match=re.escape(f"--multihost={multihost!r}: {says}")):
    distributed.initialize(multihost)


def test_the_coordinator_is_passed_as_given_an_ipv6_host_too(monkeypatch):
  joined = []
  monkeypatch.setattr(distributed.jax.distributed, "initialize",
                      lambda *args, **kwargs: joined.append((args, kwargs)))
  monkeypatch.setattr(distributed.line_filter, "LineFilter", lambda *args: None)
  distributed.initialize("[::1]:1234,2,1")
  assert joined == [(("[::1]:1234",), {"num_processes": 2, "process_id": 1})]


@pytest.mark.parametrize(
    "failure,line",
    [
        (ValueError("coordinator_address should be defined.\nmore detail"),
         "--multihost='auto' (no TPU, SLURM, Open MPI or Kubernetes cluster found): "
         "coordinator_address should be defined."),
        # a coordinator out of reach is not called a missing cluster
        (RuntimeError("DEADLINE_EXCEEDED: Barrier timed out"),
         "--multihost='auto': DEADLINE_EXCEEDED: Barrier timed out"),
    ])
def test_joining_that_fails_is_one_line_after_the_flag(monkeypatch, failure, line):
  def fail(*args, **kwargs):
    raise failure

  monkeypatch.setattr(distributed.jax.distributed, "initialize", fail)
  monkeypatch.setattr(distributed.line_filter, "LineFilter", lambda *args: None)
  with pytest.raises(ValueError) as raised:
    distributed.initialize("auto")
  assert str(raised.value) == line


def _must_not_join(*args, **kwargs):
  raise AssertionError("joined before the flag was checked")


def test_work_on_process_0_stops_every_process_together(monkeypatch):
  """Process 0's check fails: it raises its error, and the others, told so by the broadcast,
  raise too instead of going on alone into a collective."""
  def unwritable():
    raise OSError("eval output folder /ro cannot be written (Read-only file system)")

  with pytest.raises(OSError, match="Read-only file system"):  # one process
    distributed.on_process_0(unwritable, "checking /ro")
  distributed.on_process_0(lambda: None, "checking /rw")
  told = []
  monkeypatch.setattr(distributed.jax, "process_count", lambda: 2)
  monkeypatch.setattr(distributed.multihost_utils, "broadcast_one_to_all",
                      lambda failed: told.append(int(failed)) or np.int32(1))
  monkeypatch.setattr(distributed.jax, "process_index", lambda: 1)
  ran = []
  with pytest.raises(RuntimeError, match=r"^checking /ro failed on process 0 \(its log says why\)"):
    distributed.on_process_0(lambda: ran.append(1), "checking /ro")
  assert not ran and told == [0]  # process 1 does not run the work
  monkeypatch.setattr(distributed.jax, "process_index", lambda: 0)
  with pytest.raises(OSError, match="Read-only file system"):
    distributed.on_process_0(unwritable, "checking /ro")
  assert told == [0, 1]
