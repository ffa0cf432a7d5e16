"""The data position in a checkpoint (`<step>/data/`): one file per process, written by
grain's Orbax handler from the data iterator's `get_state()`, and the checks that a run can
resume from it: as many processes, and a position of the same form as this run's iterator.
"""
import json
import os
import re
from typing import Any

import grain
import jax


def data_file() -> str:
  """This process's iterator-state file in a checkpoint's `data/` (grain's naming)."""
  return f"process_{jax.process_index()}-of-{jax.process_count()}.json"


def check_process_count(where: str) -> None:
  """Checks that the data iterators of the checkpoint in `where` were saved by as many
  processes as this run has (their positions are per process).

  Raises:
    ValueError: saying how many processes to resume with.
  """
  data = os.path.join(where, "data")
  names = os.listdir(data) if os.path.isdir(data) else []
  counts = {int(m[1]) for m in (re.fullmatch(r"process_\d+-of-(\d+)\.json", n) for n in names) if m}
  if counts and jax.process_count() not in counts:
    raise ValueError(
        f"checkpoint {where} was written by {min(counts)} processes and this run has "
        f"{jax.process_count()}: each process's data position is saved apart, so resume with "
        f"{min(counts)} processes (eval.py reads the checkpoint with any number), or train in a "
        "new --workdir.")


def _state_paths(state: Any, prefix: str = "") -> set[str]:
  """The dotted paths of the leaves of a data iterator's JSON state."""
  if not isinstance(state, dict):
    return {prefix}
  return set().union(*(_state_paths(v, f"{prefix}{k}.") for k, v in state.items())) or {prefix}


def check_data_position(where: str, data_iterator: grain.DatasetIterator) -> None:
  """Checks that the data position saved in the checkpoint in `where` has the form this run's
  iterator saves. One of another pipeline (`task.packing` changed, or a commit that changed
  `relpos.data`) would fail to restore, or restore somewhere else, and is no damage.

  Raises:
    ValueError: naming a field of the saved position that this run's iterator lacks, or one
      it has that the saved position lacks.
  """
  with open(os.path.join(where, "data", data_file()), encoding="utf-8") as f:
    saved = {p.rstrip(".") for p in _state_paths(json.load(f))}
  current = {p.rstrip(".") for p in _state_paths(data_iterator.get_state())}
  if saved != current:
    only_saved, only_current = sorted(saved - current), sorted(current - saved)
    differs = (f"it has {only_saved[0]!r}, which this run's data iterator lacks" if only_saved else
               f"it lacks {only_current[0]!r}, which this run's data iterator has")
    raise ValueError(
        f"checkpoint {where}: its data position is of another data pipeline ({differs}): "
        "task.packing, or relpos.data, changed since it was saved; resume with the settings "
        "and commit it was saved with, or train in a new --workdir.")
