"""Tests for relpos.cli: the start-up of the command-line programs."""
import subprocess
import sys

import pytest
from absl import app
from absl import flags
from absl import logging

from relpos import cli


@pytest.fixture
def parsed_flags():
  """The global absl flags marked as parsed (none given); flags and log levels restored after."""
  absl_logger = logging.get_absl_logger()
  level, was_parsed = absl_logger.level, flags.FLAGS.is_parsed()
  flags.FLAGS.mark_as_parsed()
  yield flags.FLAGS
  flags.FLAGS["verbosity"].present = 0
  if not was_parsed:
    flags.FLAGS.unparse_flags()
  absl_logger.setLevel(level)  # NOTSET by default: other tests' caplog levels must apply


def test_start_quiets_library_logs_and_stays_single_process(parsed_flags):
  logging.set_verbosity(logging.INFO)
  cli.start("")
  assert logging.get_verbosity() == logging.WARNING


def test_start_keeps_an_explicit_verbosity(parsed_flags):
  parsed_flags["verbosity"].parse("1")  # as --verbosity=1 would
  cli.start("")
  assert logging.get_verbosity() == 1


def test_start_rejects_a_malformed_multihost(parsed_flags):
  with pytest.raises(ValueError, match="multihost"):
    cli.start("host:1234,two")


def test_programs_exit_with_the_error_not_a_traceback(tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "relpos.experiments.run", "--output_dir", str(tmp_path),
       "--set=train.num_steps"], capture_output=True, text=True, check=False)
  assert result.returncode == 1
  assert "error: --set 'train.num_steps': expected dotted.field=value." in result.stderr
  assert "Traceback" not in result.stderr


def test_run_returns_the_result_and_rejects_positional_arguments(parsed_flags):
  assert cli.run(["prog"], lambda: 7) == 7
  with pytest.raises(app.UsageError, match="unexpected arguments"):
    cli.run(["prog", "extra"], lambda: 7)


def test_run_turns_the_listed_errors_into_one_line(parsed_flags):
  def fail():
    raise FileNotFoundError("no such workdir")

  with pytest.raises(SystemExit, match="error: no such workdir"):
    cli.run(["prog"], fail)
  with pytest.raises(KeyError):  # not listed: a real bug keeps its traceback
    cli.run(["prog"], lambda: {}["x"])
