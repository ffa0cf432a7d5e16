"""The user's own modules (`--import`): imported before any config is built, recorded in a
run's workdir (imports.json) and imported again from there by evaluation; and the identity of
a user's position variant's code (`variant_code`), which a run records at each start."""
import hashlib
import importlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import jax
from absl import logging

from relpos import json_files
from relpos import variants
from relpos import workdir_files

_IMPORTED: list[str] = []  # what `import_modules` imported in this process, in order


def _is_file(spec: str) -> bool:
  return spec.endswith(".py") or os.sep in spec


def _import_file(path: str) -> ModuleType:
  """Imports a .py file as a module named after it (importable again by that name)."""
  name = os.path.splitext(os.path.basename(path))[0]
  if name in sys.modules and getattr(sys.modules[name], "__file__", None) == path:
    return sys.modules[name]
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  try:
    spec.loader.exec_module(module)
  except BaseException:
    del sys.modules[name]
    raise
  return module


def _origin(spec: str) -> str | None:
  """The file a module spec would run (a .py path, or the module's file), without running it."""
  if _is_file(spec):
    return os.path.abspath(spec)
  try:
    found = importlib.util.find_spec(spec)
  except (ImportError, ValueError):
    return None
  return None if found is None else found.origin


def _imported_as(origin: str) -> str | None:
  """The spec under which `import_modules` already imported the file `origin`, if it did (a
  path given once and a module name the next time: running the file again would register its
  variants twice, under two module names)."""
  for spec in _IMPORTED:
    earlier = _origin(spec)
    if earlier and os.path.isfile(earlier) and os.path.samefile(earlier, origin):
      return spec
  return None


def line_in(error: BaseException, path: str) -> str:
  """" at my_variant.py:27": the innermost line of the file `path` that `error` passed through
  ("" when none did: it arose elsewhere), for a one-line error about the user's own code."""
  origin = os.path.realpath(path)
  lines = [
      frame for frame in traceback.extract_tb(error.__traceback__)
      if os.path.realpath(frame.filename) == origin
  ]
  return f" at {os.path.basename(origin)}:{lines[-1].lineno}" if lines else ""


def _exit_words(code: Any) -> str:
  """How a module's `sys.exit(code)` is told: "exited with status 3", or with its message."""
  if code is None or isinstance(code, int):
    return f"exited with status {code or 0}"
  return f"exited ({code})"


def import_modules(specs: Sequence[str], *, refuse_under: str | None = None) -> None:
  """Imports the user's modules (a module name, or a path to a .py file), e.g. a position
  variant's, and records them for `imported`.

  Args:
    specs: what --import gave, in order.
    refuse_under: a folder whose code must never run (a workdir being evaluated).

  A file imported already under another spec (its path, then its module name, or the other
  way round) is not run again.

  Raises:
    ValueError: a module that cannot be found or imported, exits (`sys.exit`) while imported,
      or lies under `refuse_under`, naming it.
  """
  for spec in specs:
    origin = _origin(spec)
    if origin is None or (_is_file(spec) and not os.path.isfile(origin)):
      raise ValueError(f"--import={spec}: no such module or .py file (a module must be "
                       f"importable: on PYTHONPATH, or give the path of its .py file).")
    if refuse_under is not None and os.path.commonpath([
        os.path.realpath(origin), os.path.realpath(refuse_under)
    ]) == os.path.realpath(refuse_under):
      raise ValueError(f"--import={spec}: {origin} lies inside the workdir {refuse_under}; "
                       f"code found in a workdir is never run.")
    recorded = origin if _is_file(spec) else spec
    already = _imported_as(origin) if os.path.isfile(origin) else None
    if already not in (None, recorded):
      logging.info("--import=%s: %s was imported already as %s.", spec, origin, already)
      continue
    try:
      if _is_file(spec):
        _import_file(origin)
      else:
        importlib.import_module(spec)
    except SystemExit as e:  # sys.exit() in the user's module: not a silent end of the program
      raise ValueError(f"--import={spec} {_exit_words(e.code)} while being imported.") from None
    except Exception as e:  # the user's code: any error is theirs, named in one line
      raise ValueError(f"--import={spec}: importing it failed{line_in(e, origin)}: "
                       f"{type(e).__name__}: {e}") from e
    if recorded not in _IMPORTED:
      _IMPORTED.append(recorded)


def imported() -> list[str]:
  """What `import_modules` imported in this process: module names and absolute .py paths."""
  return list(_IMPORTED)


def _module_name(recorded: str) -> str:
  """The name an imported module has in sys.modules (a .py file: its name without .py)."""
  return os.path.splitext(os.path.basename(recorded))[0] if _is_file(recorded) else recorded


def write_imports(workdir: str, position: str | None = None) -> None:
  """Records in `workdir/imports.json` (process 0; no file when none) the modules evaluation
  must import again: for the run's position variant `position`, none when it is relpos's own
  (`variants.BUILT_IN`), else the one of `imported()` that registers it alone, or all of them
  when it is none of them (imported by one of them); without `position`, all of them."""
  if jax.process_index() != 0:
    return
  modules = list(_IMPORTED)
  needed = None if position is None else variants.get(position).__module__
  if position in variants.BUILT_IN:
    modules = []
  elif needed is not None and needed in map(_module_name, modules):
    modules = [m for m in modules if _module_name(m) == needed]
  if modules:
    json_files.write_json(os.path.join(workdir, workdir_files.IMPORTS_FILE), modules, indent=2)


def variant_code(position: str) -> dict[str, str | None] | None:
  """The code of position variant `position` when it is a user's own (None for relpos's own,
  `variants.BUILT_IN`): {"file": the file of the module that registers it, "sha256": of that
  file's bytes (None for a module without a file)}. A run records it at each start, so that a
  table can tell a run made by code edited since (`relpos.experiments.runner.pending_runs`);
  code the file imports from elsewhere is not covered."""
  if position in variants.BUILT_IN:
    return None
  file = variants.origin(variants.get(position))
  if not os.path.isfile(file):
    return {"file": file, "sha256": None}
  with open(file, "rb") as f:
    return {"file": file, "sha256": hashlib.sha256(f.read()).hexdigest()}


def variant_code_change(starts: Sequence[dict[str, Any]],
                        position: str) -> tuple[str, dict[str, Any]] | None:
  """(the sha256 the last of a run's `starts` recorded, `variant_code(position)` now) when the
  file of a user's position variant differs from the one that start ran; None when it is the
  same, relpos's own, or not recorded (a start from before starts recorded it)."""
  now = variant_code(position)
  recorded = [start["variant_code"]["sha256"] for start in starts if start.get("variant_code")]
  if now is None or None in (now["sha256"], *recorded[-1:]) or not recorded:
    return None
  return None if recorded[-1] == now["sha256"] else (recorded[-1], now)


def warn_of_edited_variant(starts: Sequence[dict[str, Any]], position: str, doing: str) -> None:
  """Warns when the file of a user's position variant differs from the one a run's last start
  ran (`variant_code_change`: its checkpoints were trained by the earlier code), saying what
  the caller is `doing` with it; a table refuses such a run."""
  change = variant_code_change(starts, position)
  if change is not None:
    logging.warning(
        "%s was edited since this run's last start (sha256 %s, now %s): its checkpoints were "
        "trained by the earlier code of position variant %r; %s.", change[1]["file"],
        change[0][:12], change[1]["sha256"][:12], position, doing)


def recorded_imports(workdir: str) -> list[str]:
  """The modules a run recorded in `workdir/imports.json` ([] without the file), not imported.

  Raises:
    ValueError: naming the file, when it is not a JSON list of strings.
  """
  path = os.path.join(workdir, workdir_files.IMPORTS_FILE)
  if not os.path.exists(path):
    return []
  specs = json_files.read_json(path)
  if not (isinstance(specs, list) and all(isinstance(s, str) for s in specs)):
    raise ValueError(f"{path} must hold a JSON list of module names or .py paths.")
  return specs


def import_recorded(workdir: str) -> None:
  """Imports the modules a run recorded in `workdir/imports.json` (none without the file),
  refusing any that lies inside the workdir. A recorded .py file that no longer exists is
  taken from the module of its name that `--import` gave this process (the file moved), with a
  warning naming both.

  Raises:
    ValueError: the file is not a JSON list of strings, a recorded .py file is gone and no
      --import gave its module (saying how to pass it), or a module fails (naming it).
  """
  path = os.path.join(workdir, workdir_files.IMPORTS_FILE)
  specs = recorded_imports(workdir)
  gone = [spec for spec in specs if _is_file(spec) and not os.path.isfile(spec)]
  for spec in gone:
    given = [m for m in _IMPORTED if _module_name(m) == _module_name(spec)]
    if not given:
      others = f" (--import gave {', '.join(_IMPORTED)})" if _IMPORTED else ""
      raise ValueError(f"{path}: the run's module {spec} no longer exists{others}; if it moved, "
                       f"pass it where it is now, still named {os.path.basename(spec)} (its "
                       f"module's name): --import=<its folder>/{os.path.basename(spec)}.")
    logging.warning("%s: the run's module %s no longer exists; using %s, given with --import.",
                    path, spec, given[0])
  try:
    import_modules([spec for spec in specs if spec not in gone], refuse_under=workdir)
  except ValueError as e:
    raise ValueError(f"{path}: {e}") from None
