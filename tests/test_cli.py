"""Tests for relpos.cli: the start-up of the command-line programs, and each user mistake
ending the program with one line."""
import asyncio
import gc
import logging as python_logging
import os
import re
import subprocess
import sys
import types

import pytest
from absl import flags
from absl import logging

from relpos import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# (case, files to write under the test's folder {tmp}, command, the one line it must end with).
MISTAKES = [
    ("unknown config field", {},
     ["train.py", "--workdir={tmp}/run", "--config=configs/tiny.py", "--config.model.nosuch=1"
     ], "error: --config.model.nosuch: the config has no field 'nosuch'. A field of a position "
     "variant of your own? Pass its module with --import first."),
    ("misspelled config field", {},
     ["train.py", "--workdir={tmp}/run", "--config=configs/tiny.py", "--config.train.num_step=1"
     ], "error: --config.train.num_step: the config has no field 'num_step'. "
     "Did you mean 'num_steps'?"),
    ("config field named by another name", {},
     ["train.py", "--workdir={tmp}/run", "--config=configs/tiny.py", "--config.train.lr=1e-3"
     ], "error: --config.train.lr: the config has no field 'lr'. train's fields: adam_b1, "),
    ("boolean field given another word", {}, [
        "train.py", "--workdir={tmp}/run", "--config=configs/tiny.py",
        "--config.model.relative_key=flase"
    ], "error: --config.model.relative_key=flase: not true or false."),
    ("integer field given a word", {}, [
        "train.py", "--workdir={tmp}/run", "--config=configs/tiny.py",
        "--config.train.num_steps=abc"
    ], "error: --config.train.num_steps=abc: not an integer."),
    ("override named by another name, experiments", {},
     ["-m", "relpos.experiments.run", "--output_dir={tmp}/out", "--set=train.lr=1e-3"
     ], "error: override 'train.lr': no config field 'lr'. train's fields: adam_b1, adam_b2, "),
    ("misspelled override, experiments", {},
     ["-m", "relpos.experiments.run", "--output_dir={tmp}/out", "--set=trian.num_steps=1"
     ], "error: override 'trian.num_steps': no config field 'trian'. Did you mean 'train'?"),
    (
        "a field of another variant",
        {},
        [
            "train.py",
            "--workdir={tmp}/run",
            "--config=configs/tiny.py",
            "--config.model.position=rope",
            "-config.model.max_relative_position=8"  # one dash
        ],
        "error: --config.model.max_relative_position=8: a field of position variant 'relative', "
        "not of model.position='rope' (fields: rope_base): it would change nothing."),
    ("forgotten --config=", {}, ["train.py", "configs/tiny.py", "--workdir={tmp}/run"],
     "error: unexpected argument 'configs/tiny.py' (did you mean --config=configs/tiny.py?)."),
    ("a positional argument to eval.py", {}, ["eval.py", "x.py", "--workdir={tmp}/run"],
     "error: unexpected argument 'x.py' (flags are written --name=value)."),
    ("missing config file", {}, ["train.py", "--workdir={tmp}/run", "--config=configs/nosuch.py"],
     "error: --config: configs/nosuch.py: No such file or directory."),
    ("unknown ablation row", {},
     ["train.py", "--workdir={tmp}/run", "--config=configs/ablation.py:foo"
     ], "error: flag --config=configs/ablation.py:foo: unknown ablation row 'foo'; allowed: abs, "),
    ("ablation config without a row", {},
     ["train.py", "--workdir={tmp}/run", "--config=configs/ablation.py"
     ], "error: flag --config=configs/ablation.py: configs/ablation.py needs a row: "
     "configs/ablation.py:<row> or configs/ablation.py:<row>,<task>; rows: abs, rel_kv, "),
    ("override of another type", {},
     ["-m", "relpos.experiments.run", "--output_dir={tmp}/out", "--set=train.num_steps=abc"
     ], "error: override train.num_steps='abc': the field holds int values, e.g. 1000."),
    ("unknown field, experiments", {},
     ["-m", "relpos.experiments.run", "--output_dir={tmp}/out", "--config.model.nosuch=1"
     ], "error: --config.model.nosuch: the config has no field 'nosuch'. A field of a position "
     "variant of your own? Pass its module with --import first."),
    ("malformed k", {},
     ["-m", "relpos.experiments.run", "--output_dir={tmp}/out", "--table=k_sweep",
      "--rows=k=x"], "error: row 'k=x': k must be a non-negative integer, e.g. 'k=4'."),
    ("empty rows", {}, ["-m", "relpos.experiments.run", "--output_dir={tmp}/out", "--rows="],
     "error: --rows is empty: name at least one row, or leave the flag out for all of the "
     "table's rows."),
    ("a variant's field named like the model's, experiments", {
        "v.py": "from relpos import fields, variants\n\n\n@variants.register('hd')\n"
                "class HeadDim(variants.Variant):\n"
                "  fields = {'head_dim': fields.Field(8, fields.integer(1), 'x')}\n"
    }, ["-m", "relpos.experiments.run", "--import={tmp}/v.py", "--list"],
     "error: position variant 'hd' ({tmp}/v.py) declares field model.head_dim, which is the "
     "Transformer's own"),
    ("an average of more checkpoints than a run saves", {}, [
        "train.py", "--workdir={tmp}/run", "--config.decode.checkpoint=average:3",
        "--config.train.keep_checkpoints=3"
    ], "error: config field decode.checkpoint='average:3' "
     "averages more checkpoints than the 2 a run saves on schedule (train.num_steps=1000, "
     "train.checkpoint_every_steps=500, train.eval_every_steps=500)."),
    ("an absolute encoding relative attention does not add", {}, [
        "train.py", "--workdir={tmp}/run", "--config=configs/ablation.py:rel_kv,tiny",
        "--config.model.absolute_type=learned"
    ], "error: config field model.absolute_type='learned' is invalid: must be 'sinusoidal' unless "
     "model.add_absolute=True"),
    ("a config file that does not parse", {"bad.py": "def get_config(:\n  pass\n"},
     ["train.py", "--workdir={tmp}/run", "--config={tmp}/bad.py"
     ], "error: --config={tmp}/bad.py: SyntaxError: invalid syntax (bad.py, line 1)"),
    ("a config file's own missing field", {
        "bad.py": "from configs import default\n\n\ndef get_config():\n"
                  "  config = default.get_config()\n  config.modle.emb_dim = 32\n  return config\n"
    }, ["train.py", "--workdir={tmp}/run", "--config={tmp}/bad.py"],
     "error: --config={tmp}/bad.py: the config has no field 'modle'. Did you mean 'model'?"),
    ("a config file without get_config", {"bad.py": "x = 1\n"},
     ["train.py", "--workdir={tmp}/run",
      "--config={tmp}/bad.py"], "error: --config={tmp}/bad.py: AttributeError: module "),
    ("no seeds", {}, ["-m", "relpos.experiments.run", "--output_dir={tmp}/out",
                      "--seeds=0"], "error: no seeds to run: --seeds must be at least 1."),
    ("config.json not JSON", {"run/config.json": '{"task": '
                             }, ["eval.py", "--workdir={tmp}/run", "--split=test"],
     "error: {tmp}/run/config.json is not valid JSON (Expecting value: line 1 column 10 "
     "(char 9))."),
    ("config.json with __reduce__", {"run/config.json": '{"__reduce__": "os.system"}'
                                    }, ["eval.py", "--workdir={tmp}/run", "--split=test"],
     "error: {tmp}/run/config.json does not hold a config: '__reduce__ cannot be overridden.'"),
    ("truncated result.json",
     {"out/runs/synthetic-ablation-abs-seed0/result.json": '{"table": "abl'
     }, ["-m", "relpos.experiments.run", "--output_dir={tmp}/out", "--rows=abs"
        ], "error: {tmp}/out/runs/synthetic-ablation-abs-seed0/result.json is not valid JSON "
     "(Unterminated string starting at: line 1 column 11 (char 10)): delete it to evaluate that "
     "run again."),
]


@pytest.fixture
def parsed_flags():
  """The global absl flags marked as parsed (none given); flags and log levels restored after."""
  absl_logger = logging.get_absl_logger()
  level, was_parsed = absl_logger.level, flags.FLAGS.is_parsed()
  flags.FLAGS.mark_as_parsed()
  yield flags.FLAGS
  absl_logger.removeFilter(cli.LIBRARY_NOISE)
  python_logging.getLogger("asyncio").removeFilter(cli.UNRETRIEVED_READS)
  flags.FLAGS["verbosity"].present = 0
  if not was_parsed:
    flags.FLAGS.unparse_flags()
  absl_logger.setLevel(level)  # NOTSET by default: other tests' caplog levels must apply


def test_start_quiets_library_logs_and_stays_single_process(parsed_flags):
  logging.set_verbosity(logging.INFO)
  cli.start("")
  assert logging.get_verbosity() == logging.WARNING


def _record(path: str, level: int) -> python_logging.LogRecord:
  return python_logging.LogRecord("absl", level, path, 1, "message", None, None)


def test_start_drops_the_warnings_of_orbax_tfds_and_grain(parsed_flags):
  cli.start("")
  absl_logger = logging.get_absl_logger()
  orbax = "/venv/site-packages/orbax/checkpoint/checkpoint_manager.py"
  tfds = "/venv/site-packages/tensorflow_datasets/core/dataset_builder.py"
  relpos = os.path.join(ROOT, "relpos", "checkpoints.py")
  assert not absl_logger.filter(_record(orbax, python_logging.WARNING))
  assert not absl_logger.filter(_record(tfds, python_logging.WARNING))
  assert absl_logger.filter(_record(orbax, python_logging.ERROR))
  assert absl_logger.filter(_record(relpos, python_logging.WARNING))


def test_start_drops_orbax_records_of_a_failed_save_that_relpos_raises(parsed_flags):
  cli.start("")
  absl_logger = logging.get_absl_logger()
  future = "/venv/site-packages/orbax/checkpoint/_src/futures/future.py"
  failed = _record(future, python_logging.ERROR)
  failed.exc_info = (OSError, OSError(28, "No space left on device"), None)
  assert not absl_logger.filter(failed)
  wrapped = Exception("Encountered error while reading array index")
  wrapped.__cause__ = ValueError("FAILED_PRECONDITION: Truncated Zstd-compressed stream")
  failed.exc_info = (Exception, wrapped, None)
  assert not absl_logger.filter(failed)
  other = _record(future, python_logging.ERROR)
  other.exc_info = (KeyError, KeyError("x"), None)
  assert absl_logger.filter(other)  # not one that relpos raises: kept


FAILING_READ = """
async def read():
  raise ValueError("NOT_FOUND: Error opening \\"zarr3\\" driver: checkpoints/28/state is "
                   "missing [tensorstore_spec='{...}']")
"""


def _wrapped_read(inner: str) -> str:
  """A read that raises `inner` (Python source of an exception), which Orbax's async_deserialize
  wraps in a bare Exception."""
  return f"""
async def read():
  try:
    raise {inner}
  except BaseException as e:
    raise Exception("Encountered error while reading array index: (slice(0, 64, 1),)") from e
"""


# The failed read of a truncated array file.
FAILING_WRAPPED_READ = _wrapped_read('ValueError("FAILED_PRECONDITION: Truncated Zstd-compressed '
                                     'stream")')


def _unretrieved_read(folder, source: str, kind: str = "task") -> None:
  """Runs `read` of `source` written in `folder`/reader.py as a task whose exception is never
  retrieved (as the sibling reads of a failed checkpoint read are), or (`kind` "future") hands
  what it raised to a future no one asks, then collects it."""
  folder.mkdir(parents=True)
  (folder / "reader.py").write_text(source)
  namespace = {}
  code = compile(source, str(folder / "reader.py"), "exec")
  exec(code, namespace)  # pylint: disable=exec-used
  loop = asyncio.new_event_loop()
  if kind == "task":
    waited = loop.create_task(namespace["read"]())
    loop.run_until_complete(asyncio.sleep(0))
  else:
    waited = loop.create_future()
    try:
      loop.run_until_complete(namespace["read"]())
    except Exception as e:  # pylint: disable=broad-exception-caught
      waited.set_exception(e)
  loop.close()
  del waited
  gc.collect()


# Under load, tensorstore's answer to a sibling read can come after Orbax closed the read's loop.
LATE_READ = _wrapped_read('RuntimeError("Event loop is closed")')


@pytest.mark.parametrize("kind", ["task", "future"])
@pytest.mark.parametrize("source", [FAILING_READ, FAILING_WRAPPED_READ, LATE_READ],
                         ids=["raw", "wrapped", "late"])
def test_start_drops_asyncio_reports_of_orbax_reads_left_unretrieved(parsed_flags, tmp_path, caplog,
                                                                     source, kind):
  """eval.py beside training printed four of them, each with a tensorstore spec."""
  gc.collect()  # tasks that earlier tests left unretrieved are reported now, not below
  caplog.clear()
  cli.start("")
  _unretrieved_read(tmp_path / "site-packages" / "orbax" / "checkpoint", source, kind)
  assert "never retrieved" not in caplog.text
  _unretrieved_read(tmp_path / "mine", source, kind)  # not Orbax's: kept
  assert f"{kind.title()} exception was never retrieved" in caplog.text


def _unraisable(error: BaseException, filename: str) -> types.SimpleNamespace:
  """What Python hands `sys.unraisablehook` for `error` raised in a function of `filename`."""
  namespace = {}
  exec(compile("def fail(e):\n  raise e\n", filename, "exec"), namespace)  # pylint: disable=exec-used
  try:
    namespace["fail"](error)
  except BaseException as e:  # pylint: disable=broad-exception-caught
    return types.SimpleNamespace(
        exc_type=type(e),
        exc_value=e,
        exc_traceback=e.__traceback__.tb_next,  # fail's frame alone
        err_msg=None,
        object=None)
  raise AssertionError("not raised")


def _closed_read() -> Exception:
  try:
    raise GeneratorExit
  except BaseException as e:  # pylint: disable=broad-exception-caught
    wrapped = Exception("Encountered error while reading array index: (slice(0, 64, 1),)")
    wrapped.__cause__ = e
    return wrapped


ORBAX_FILE = f"{os.sep}site-packages{os.sep}orbax{os.sep}checkpoint{os.sep}serialization.py"
ASYNCIO_FILE = f"{os.sep}lib{os.sep}asyncio{os.sep}base_events.py"


def test_start_drops_python_reports_of_a_failed_reads_leftovers_and_passes_on_others(
    parsed_flags, monkeypatch):
  reported = []
  monkeypatch.setattr(sys, "unraisablehook", reported.append)
  cli.start("")
  cli.start("")  # wrapped once
  leftovers = [
      _unraisable(_closed_read(), ORBAX_FILE),
      _unraisable(RuntimeError("Event loop is closed"), ASYNCIO_FILE),
      _unraisable(Exception("Encountered error"), ORBAX_FILE),
      _unraisable(Exception("Encountered error"), ORBAX_FILE),
  ]
  leftovers[2].exc_value.__cause__ = ValueError("NOT_FOUND: Error opening \"zarr3\" driver")
  leftovers[3].exc_value.__cause__ = RuntimeError("Event loop is closed")
  others = [
      _unraisable(_closed_read(), f"{os.sep}mine{os.sep}reader.py"),  # not Orbax's
      _unraisable(RuntimeError("Event loop is closed"), f"{os.sep}mine{os.sep}loop.py"),
      _unraisable(RuntimeError("something else"), ASYNCIO_FILE),
      _unraisable(KeyError("x"), ORBAX_FILE),
  ]
  for unraisable in leftovers + others:
    sys.unraisablehook(unraisable)
  assert reported == others


def test_start_keeps_an_explicit_verbosity(parsed_flags):
  parsed_flags["verbosity"].parse("1")  # as --verbosity=1 would
  cli.start("")
  assert logging.get_verbosity() == 1


def test_start_rejects_a_malformed_multihost(parsed_flags):
  with pytest.raises(ValueError, match="multihost"):
    cli.start("host:1234,two")


def test_programs_exit_with_the_error_not_a_traceback(tmp_path):
  result = subprocess.run([
      sys.executable, "-m", "relpos.experiments.run", "--output_dir",
      str(tmp_path), "--set=train.num_steps"
  ], capture_output=True, text=True, check=False)
  assert result.returncode == 1
  assert "error: --set 'train.num_steps': expected dotted.field=value." in result.stderr
  assert "Traceback" not in result.stderr


def test_run_returns_the_result_and_rejects_positional_arguments(parsed_flags):
  assert cli.run(["prog"], lambda: 7) == 7
  with pytest.raises(SystemExit) as raised:
    cli.run(["prog", "extra", "more"], lambda: 7)
  assert str(raised.value) == ("error: unexpected arguments 'extra' 'more' (flags are written "
                               "--name=value).")


def test_run_turns_the_listed_errors_into_one_line(parsed_flags):
  def fail():
    raise FileNotFoundError("no such workdir")

  with pytest.raises(SystemExit, match="error: no such workdir"):
    cli.run(["prog"], fail)
  with pytest.raises(KeyError):  # not listed: a real bug keeps its traceback
    cli.run(["prog"], lambda: {}["x"])


def test_run_shortens_a_tensorstore_error_to_the_file_and_the_reason(parsed_flags):
  spec = "{" + ", ".join(f'"field_{i}": "{i:04d}"' for i in range(60)) + "}"

  def fail():
    raise ValueError(f"NOT_FOUND: Error opening \"zarr3\" driver: /runs/x/checkpoints/28/state "
                     f"is missing [tensorstore_spec='{spec}'] [source locations='a.cc:1']\n"
                     f"second line")

  with pytest.raises(SystemExit) as stop:
    cli.run(["prog"], fail)
  assert str(stop.value) == ('error: NOT_FOUND: Error opening "zarr3" driver: '
                             '/runs/x/checkpoints/28/state is missing')
  with pytest.raises(SystemExit, match=r"^error: runs/x: No space left on device\.$"):
    cli.run(["prog"], lambda:
            (_ for _ in ()).throw(OSError(28, "No space left on device", "runs/x")))


@pytest.mark.parametrize("case, files, command, line", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_user_mistakes_end_with_one_line(case, files, command, line, tmp_path):
  del case  # the test's id
  for name, text in files.items():
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text(text, encoding="utf-8")
  done = subprocess.run([sys.executable, *(arg.format(tmp=tmp_path) for arg in command)], cwd=ROOT,
                        capture_output=True, text=True, check=False)
  assert done.returncode == 1
  assert done.stderr.strip().splitlines()[-1].startswith(line.format(tmp=tmp_path)), done.stderr
  assert "Traceback" not in done.stderr
  assert not (tmp_path / "run" / "checkpoints").exists()


def test_train_py_finds_its_default_config_from_any_folder(tmp_path):
  done = subprocess.run([
      sys.executable,
      os.path.join(ROOT, "train.py"), "--workdir=run", "--config.train.num_steps=0"
  ], cwd=tmp_path, capture_output=True, text=True, check=False)
  assert done.stderr.strip().splitlines()[-1] == ("error: config field train.num_steps=0 is "
                                                  "invalid: must be an integer >= 1.")


@pytest.mark.parametrize("program, flags_listed", [
    (["train.py"], ["--config", "--import", "--multihost", "--workdir"]),
    (["eval.py"], ["--import", "--multihost", "--workdir", "--split", "--checkpoint"]),
    (["-m", "relpos.experiments.run"], ["--import", "--set", "--table", "--rows", "--status"]),
])
def test_help_lists_the_flags_the_readme_names(program, flags_listed):
  """--help shows the program's key flags only: those defined through relpos.cli (--config,
  --import, --multihost) must be among them, not left to --helpfull."""
  done = subprocess.run([sys.executable, *program, "--help"], cwd=ROOT, capture_output=True,
                        text=True, check=False)  # absl's --help exits with status 1
  listed = set(re.findall(r"^  --(?:\[no\])?(\w+)", done.stdout, re.MULTILINE))
  assert {flag.removeprefix("--") for flag in flags_listed} <= listed, done.stdout


def test_imports_are_found_in_flagfiles_and_with_one_dash(tmp_path):
  """A variant's module named in a --flagfile was never imported (absl reads the file after the
  modules were due), so its variant was unknown to the config."""
  flagfile = tmp_path / "flags.txt"
  flagfile.write_text("--import=/x/mine.py\n--config.train.num_steps=4\n", encoding="utf-8")
  argv = ["train.py", f"--flagfile={flagfile}", "-import", "my.module", "--import=other.py"]
  assert cli._imports_in(argv) == ["/x/mine.py", "my.module", "other.py"]  # pylint: disable=protected-access
  assert cli._imports_in(["eval.py", "--flagfile=/no/such/file"]) == []  # pylint: disable=protected-access
