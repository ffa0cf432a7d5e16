"""Start-up shared by the command-line programs (train.py, eval.py, relpos.experiments.run)."""
import asyncio
import contextlib
import logging as python_logging
import os
import re
import sys
import traceback
import types
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from absl import flags
from absl import logging
import ml_collections
from ml_collections import config_flags

from relpos import checkpoint_damage
from relpos import distributed
from relpos import fields
from relpos import locks
from relpos import model_config
from relpos import prng
from relpos import priority
from relpos import source_tree
from relpos import recorder
from relpos import run_config
from relpos import user_modules

Result = TypeVar("Result")
# What a user's input, the state of a workdir or the machine (a full disk, a folder without
# write permission) can cause: one line, no traceback.
USER_ERRORS = (ValueError, OSError, locks.WorkdirInUseError, recorder.NonFiniteError)
# Packages whose warnings speak to their own developers, not to a relpos user (TFDS's "Using
# custom data configuration ...", Orbax's "Requested `tracked_metric`; did not provide
# metrics."): without --verbosity only their errors are shown.
QUIET_PACKAGES = ("orbax", "tensorflow_datasets", "grain")


def _in_chain(error: BaseException | None, matches: Callable[[BaseException], bool]) -> bool:
  """Whether `error`, or an error it was raised from (its cause or context, in turn), matches."""
  seen = set()
  while error is not None and id(error) not in seen:
    if matches(error):
      return True
    seen.add(id(error))
    error = error.__cause__ or error.__context__
  return False


def _is_io_failure(error: BaseException | None) -> bool:
  """Whether `error`, or an error it was raised from, is an OSError or ValueError: Orbax wraps a
  failed array read in a bare Exception ("Encountered error while reading array index ...")
  raised from tensorstore's ValueError."""
  return _in_chain(error, lambda e: isinstance(e, (OSError, ValueError)))


def _is_abandoned_read(error: BaseException | None) -> bool:
  """Whether `error`, or an error it was raised from, ends a checkpoint read that nobody waits
  for any more: an OSError or ValueError (tensorstore's failure), GeneratorExit or
  CancelledError (closed unfinished), or asyncio's "Event loop is closed" (tensorstore's answer
  after Orbax closed the read's loop; under load it reaches a read still running)."""
  return _in_chain(
      error, lambda e: isinstance(e,
                                  (OSError, ValueError, GeneratorExit, asyncio.CancelledError)) or
      (isinstance(e, RuntimeError) and str(e) == "Event loop is closed"))


def _raised_in(package: str, trace: types.TracebackType | None) -> bool:
  """Whether a frame of `trace` is in a file of the installed `package` (a folder of that name)."""
  return any(
      f"{os.sep}{package}{os.sep}" in frame.filename for frame in traceback.extract_tb(trace))


class LibraryNoiseFilter(python_logging.Filter):
  """Drops records below ERROR logged from a module of QUIET_PACKAGES, and Orbax's records of
  an OSError or ValueError with its traceback: a failed background save, which Orbax logs from
  each thread it passes through and raises where relpos waits for it, as one line naming the
  checkpoint and step (`relpos.checkpoints.wait`)."""
  def filter(self, record: python_logging.LogRecord) -> bool:
    parts = record.pathname.split(os.sep)
    if not any(p in parts for p in QUIET_PACKAGES):
      return True
    error = record.exc_info[1] if record.exc_info else None
    if "orbax" in parts and _is_io_failure(error):
      return False
    return record.levelno >= python_logging.ERROR


LIBRARY_NOISE = LibraryNoiseFilter()

# asyncio's reports of a task's, or a future's, exception that no one asked for.
UNRETRIEVED_MESSAGES = ("Task exception was never retrieved",
                        "Future exception was never retrieved")


class UnretrievedReadFilter(python_logging.Filter):
  """Drops asyncio's "Task (or Future) exception was never retrieved" records of an abandoned read
  (`_is_abandoned_read`) in Orbax's code: the sibling reads of a checkpoint read that
  failed (a checkpoint that training deleted while `eval.py` read it, or a truncated one), whose
  first error Orbax raised and relpos handled (`relpos.checkpoints.restore_newest`). Each carried
  a tensorstore spec of 1,000 characters."""
  def filter(self, record: python_logging.LogRecord) -> bool:
    error = record.exc_info[1] if record.exc_info else None
    if not (_is_abandoned_read(error) and str(record.msg).startswith(UNRETRIEVED_MESSAGES)):
      return True
    return not _raised_in("orbax", error.__traceback__)


UNRETRIEVED_READS = UnretrievedReadFilter()


def is_failed_read_leftover(unraisable: "sys.UnraisableHookArgs") -> bool:
  """Whether an exception Python could not raise (`sys.unraisablehook`) is left over from a
  checkpoint read that failed and that relpos handled (`relpos.checkpoints.restore_newest`):
  one of the sibling reads Orbax had started, closed unfinished (Orbax's coroutine wraps the
  GeneratorExit that closes it in "Encountered error while reading array index"), or
  tensorstore's answer to one arriving after Orbax closed their event loop (asyncio's "Event
  loop is closed"). `eval.py` on a run whose newest checkpoint had lost its array files printed
  2,500 lines of them, each with a tensorstore spec."""
  error, trace = unraisable.exc_value, unraisable.exc_traceback
  if isinstance(error, RuntimeError):
    return (str(error) == "Event loop is closed" and all(
        f"{os.sep}asyncio{os.sep}" in frame.filename for frame in traceback.extract_tb(trace)))
  return _is_abandoned_read(error) and _raised_in("orbax", trace)


def drop_failed_read_leftovers() -> None:
  """Wraps `sys.unraisablehook` (once) so that it passes on all but `is_failed_read_leftover`."""
  previous = sys.unraisablehook
  if getattr(previous, "drops_failed_read_leftovers", False):
    return

  def hook(unraisable: "sys.UnraisableHookArgs") -> None:
    if not is_failed_read_leftover(unraisable):
      previous(unraisable)

  hook.drops_failed_read_leftovers = True
  sys.unraisablehook = hook


def define_multihost_flag() -> flags.FlagHolder:
  """Defines --multihost (see `relpos.distributed.initialize`)."""
  return flags.DEFINE_string(
      "multihost", "", "Several processes: 'auto' (TPU, SLURM, MPI, Kubernetes) or "
      "'<coordinator host:port>,<num_processes>,<process_id>'.")


_ERRNO = re.compile(r"\[Errno \d+\] ([^:']+): '([^']+)'$")
# ml_collections' words for a config file that failed to load, before the cause.
_CONFIG_NOT_LOADED = "Configuration is not available because of an earlier failure to load: "


def _errno_as_file(message: str) -> str:
  """`message` with an ending "[Errno 2] No such file or directory: 'x'" (Python's words for an
  OSError) as "x: No such file or directory.", and ml_collections' preamble to a config file
  that failed to load as "--config: "."""
  message = message.replace(_CONFIG_NOT_LOADED, "--config: ")
  return _ERRNO.sub(r"\2: \1.", message)


# Python's words for a --config.<field>=<value> that does not parse as the field's type (as
# ml_collections passes them on) -> the user's.
_UNPARSED_VALUE = {
    re.compile(r"\('Non-boolean argument to boolean flag', .*\)$"): "not true or false",
    re.compile(r"invalid literal for int\(\) with base 10: .*$"): "not an integer",
    re.compile(r"could not convert string to float: .*$"): "not a number",
}


def _value_error_in_words(message: str) -> str:
  """`message` ("flag --config.x=v: <Python's words>") in the user's words where it says a
  value does not parse as its field's type: "--config.x=v: not an integer."."""
  for words, meaning in _UNPARSED_VALUE.items():
    if words.search(message):
      return words.sub(f"{meaning}.", message.removeprefix("flag "))
  return message


def _one_line(error: Exception) -> str:
  """An error's message on one line: its first line's subject and its last line (the cause,
  when the message holds a traceback, as ml_collections' config file errors do)."""
  lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
  if len(lines) < 2:
    return lines[0] if lines else type(error).__name__
  cause = re.sub(r"^\w+(Error|Exception): ", "", lines[-1])
  return f"{lines[0].split(': ')[0]}: {cause}"


def _unknown_field(argv: Sequence[str], error: LookupError | AttributeError) -> str:
  """The message for a config override naming a field the config does not have.

  ml_collections raises a KeyError (inside an AttributeError for attribute access) whose
  message is the field's name in quotes, then, when a field's name is close, a line
  'Did you mean "num_steps" instead of "num_step"?'.
  """
  while error.args and isinstance(error.args[0], BaseException):
    error = error.args[0]
  if not isinstance(error, KeyError):  # not ml_collections' missing field: the file's own
    return _config_error(argv, error)
  message = str(error.args[0]) if error.args else str(error)
  name_line = message.split("\n")[0]
  field = name_line.strip("\"'")
  close = re.findall(r'Did you mean "([^"]+)"', message)
  given = [
      arg.split("=")[0]
      for arg in argv[1:]
      if arg.startswith("--") and field in arg.split("=")[0].split(".")[1:]
  ]
  path = given[0].removeprefix("--config.") if given else ""
  there = run_config.SECTIONS.get(path.rsplit(".", 1)[0], {}) if "." in path else ()
  return (f"{given[0] if given else _config_file(argv)}: the config has no field {field!r}."
          f"{fields.did_you_mean(close, path, list(there))}")


def _config_file(argv: Sequence[str]) -> str:
  """The --config=<file> of a command line, or "the config file" when it names none."""
  given = [arg.lstrip("-") for arg in argv[1:] if re.match(r"--?config=", arg)]
  return f"--{given[-1]}" if given else "the config file"


def _config_error(argv: Sequence[str], error: BaseException) -> str:
  """One line for an error a config file raised as it loaded (a SyntaxError, an ImportError, a
  NameError, no get_config): the file, the error's type and its message's first line."""
  line = (str(error).strip().splitlines() or [""])[0]
  return f"{_config_file(argv)}: {type(error).__name__}: {line}".rstrip(": ")


@contextlib.contextmanager
def _mistakes_as_one_line(argv: Sequence[str]) -> Iterator[None]:
  """Ends the program with status 1 and one line "error: ..." for a bad flag value, an error
  raised by a config file, a config file that cannot be loaded, or an override of a config
  field that does not exist (absl and ml_collections print several lines or a traceback)."""
  try:
    yield
  except (flags.Error, OSError) as e:
    sys.exit(f"error: {_value_error_in_words(_errno_as_file(_one_line(e)))}")
  except (LookupError, AttributeError) as e:  # ml_collections: an override of a missing field
    sys.exit(f"error: {_unknown_field(argv, e)}")
  except Exception as e:  # pylint: disable=broad-exception-caught
    sys.exit(f"error: {_config_error(argv, e)}")  # raised by the config file as it loaded


def _imports_in(argv: Sequence[str]) -> list[str]:
  """The values of every --import=X (or --import X, one dash too) in a command line, its
  --flagfile files read as absl reads them (a file that cannot be read is left to absl's
  parsing to name)."""
  try:
    argv = flags.FLAGS.read_flags_from_files(list(argv), force_gnu=False)
  except flags.Error:
    pass
  found = []
  for i, arg in enumerate(argv):
    name, has_value, value = arg.lstrip("-").partition("=")
    if not arg.startswith("-") or name != "import":
      continue
    if has_value:
      found.append(value)
    elif i + 1 < len(argv):
      found.append(argv[i + 1])
  return found


def define_import_flag() -> flags.FlagHolder:
  """Defines --import (repeatable) and imports its modules at once, before any config is built
  or validated, so that the position variants they register can be configured and trained
  (like fairseq's --user-dir). Call it before the config flags. A module that cannot be
  imported ends the program with one line."""
  holder = flags.DEFINE_multi_string(
      "import", [], "A module of your own to import first (a module name, or the path of a "
      ".py file), e.g. one that registers a position variant; repeatable.")
  try:
    user_modules.import_modules(_imports_in(sys.argv))
    model_config.variant_fields()  # a variant's field that clashes: one line here too
  except ValueError as e:
    sys.exit(f"error: {e}")
  return holder


def define_config_flag(default: str) -> flags.FlagHolder:
  """Defines --config (a configs/*.py file[:args]; any field overridable as
  --config.<field>=value). Its default is loaded here, with the overrides of the command line,
  so their mistakes are one line here too."""
  with _mistakes_as_one_line(sys.argv):
    return config_flags.DEFINE_config_file(
        "config", default,
        ("Config file (configs/*.py[:args]), e.g. configs/ablation.py:rel_k,multi30k; any field "
         "is set with --config.<field>=value, e.g. --config.train.num_steps=2000."),
        lock_config=True)


def define_overrides_flag(config: ml_collections.ConfigDict, help_text: str) -> flags.FlagHolder:
  """Defines --config over a fixed `config` (no file): only its --config.<field>=value
  overrides are read from the command line, their mistakes one line as for
  `define_config_flag`."""
  with _mistakes_as_one_line(sys.argv):
    return config_flags.DEFINE_config_dict("config", config, help_text, lock_config=True)


def check_model_overrides(config_flag: flags.FlagHolder) -> None:
  """Refuses a `--config.model.<field>` override (as absl read it: either dash, or from a
  --flagfile) that the run's position variant does not have
  (`model_config.check_fields_used`): it would change nothing.

  Raises:
    ValueError: naming the flag, the variant that has the field and the run's.
  """
  config = config_flag.value
  given = config_flags.get_override_values(flags.FLAGS[config_flag.name])
  model_config.check_fields_used(
      {
          name.removeprefix("model."): value
          for name, value in given.items()
          if name.startswith("model.")
      }, [config.model.position], "--config.model.")


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing (`app.run`'s flags_parser), every mistake one line (see
  `_mistakes_as_one_line`)."""
  with _mistakes_as_one_line(argv):
    remaining = flags.FLAGS(argv)
    for name in flags.FLAGS:  # a config file that failed to load raises when first read
      if hasattr(flags.FLAGS[name], "config_filename"):
        flags.FLAGS[name].value.keys()
    return remaining


def start(multihost: str = "") -> None:
  """A program's start-up: quiets library INFO logs and the warnings of QUIET_PACKAGES unless
  --verbosity was given, drops asyncio's reports of Orbax reads left unretrieved
  (`UnretrievedReadFilter`) and Python's of their leftovers (`drop_failed_read_leftovers`),
  compiles jax.random's Threefry hash unrolled on CPU (dropout masks: the same bits in less
  time, `relpos.prng`), gives a program started with `setsid nice` its niceness against other
  sessions too (`relpos.priority`), then joins a multi-process run.

  Library logs (Orbax, TFDS, absl) would break the progress bar and drown the one line per run.

  Raises:
    ValueError: a malformed `multihost`.
  """
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
    logging.get_absl_logger().addFilter(LIBRARY_NOISE)
  python_logging.getLogger("asyncio").addFilter(UNRETRIEVED_READS)
  drop_failed_read_leftovers()
  prng.lower_threefry_unrolled_on_cpu()
  priority.lower_session_to_own_niceness()
  source_tree.commit()  # the code this process loaded: its runs record it
  distributed.initialize(multihost)


def _message(error: BaseException) -> str:
  """One line for a user's mistake, as `checkpoint_damage.short_cause` gives it, with an operating
  system's error as "<file>: <reason>." (`_errno_as_file`)."""
  return _errno_as_file(checkpoint_damage.short_cause(error, max_chars=None))


def run(argv: Sequence[str], work: Callable[[], Result], *, multihost: str = "") -> Result:
  """The body of a program's absl `main`: `start`, then `work()`, whose result it returns.

  Raises:
    SystemExit: "error: unexpected argument ..." (status 1) on positional arguments, with a
      hint at --config= for a config file's path.
    SystemExit: "error: <message>" (status 1) for any of USER_ERRORS, instead of a traceback
      (the message's first line, without a tensorstore spec: `checkpoint_damage.short_cause`);
      "interrupted[: <message>]" (status 130) on KeyboardInterrupt.
  """
  if len(argv) > 1:
    extra = argv[1:]
    takes_file = "config" in flags.FLAGS and hasattr(flags.FLAGS["config"], "config_filename")
    hint = (f" (did you mean --config={extra[0]}?)" if takes_file and
            extra[0].split(":")[0].endswith(".py") else " (flags are written --name=value)")
    sys.exit(f"error: unexpected argument{'s' if len(extra) > 1 else ''} "
             f"{' '.join(map(repr, extra))}{hint}.")
  try:
    start(multihost)
    return work()
  except USER_ERRORS as e:
    sys.exit(f"error: {_message(e)}")
  except KeyboardInterrupt as e:  # SIGINT: training saved first (see relpos.preemption)
    print(f"interrupted: {e}" if str(e) else "interrupted", file=sys.stderr)
    sys.exit(130)
