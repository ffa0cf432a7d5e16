"""Tests for relpos.distributed: joining a multi-process run (tests/test_reliability.py runs
two processes through it)."""
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
