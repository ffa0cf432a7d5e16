"""The name of a table run's workdir, `<task>-<table>-<row>-seed<seed>`, and its reading back.

A k sweep row `k=16` is named `k16` (no `=` in a folder name). Task and table names hold no
`-`; a row may (a variant of one's own), since it is read as everything between them:

  >>> run_name("multi30k_gpu", "ablation", "rel_kv", 0)
  'multi30k_gpu-ablation-rel_kv-seed0'
  >>> parse_run_name("synthetic-k_sweep-k16-seed2")
  RunName(task='synthetic', table='k_sweep', row='k=16', seed=2)

The names are what a restarted table finds its runs by: changing them would train every
finished run again.
"""
from typing import NamedTuple

from relpos.experiments import tables

_SEPARATOR = "-"
_SEED_MARK = "-seed"
_K_SWEEP = "k_sweep"


class RunName(NamedTuple):
  """What a run's workdir name says."""
  task: str
  table: str
  row: str
  seed: int


def run_name(task: str, table: str, row: str, seed: int) -> str:
  """The workdir name of (row, seed) of `table` on `task`.

  Raises:
    ValueError: a task or table name holding "-", which `parse_run_name` could not split.
  """
  for kind, name in (("task", task), ("table", table)):
    if _SEPARATOR in name:
      raise ValueError(f"{kind} name {name!r} holds {_SEPARATOR!r}, which separates the parts "
                       f"of a run's folder name; name it without.")
  row_part = row.replace("=", "")  # k=16 -> k16
  return _SEPARATOR.join((task, table, row_part)) + f"{_SEED_MARK}{seed}"


def run_name_of(result: dict) -> str:
  """`run_name` of a run's result (result.json, or a run of a table's results.json): the
  folder a table finds that run in now, whatever its "workdir" was called when it ran (runs
  published before the task led the name were `<table>-<row>-seed<seed>`)."""
  return run_name(result["task"], result["table"], result["row"], result["seed"])


def parse_run_name(name: str) -> RunName | None:
  """`run_name`'s parts read back from a folder name; None for a name it does not make (a run
  moved aside by --retrain_changed, `<name>.replaced-<time>`, or a k sweep row not `k<int>`)."""
  head, mark, seed = name.rpartition(_SEED_MARK)
  parts = head.split(_SEPARATOR, 2)
  if not mark or not seed.isdigit() or len(parts) != 3 or not all(parts):
    return None
  task, table, row = parts
  if table == _K_SWEEP:
    k = row.removeprefix("k")
    if k == row or not k.isdigit():
      return None
    row = tables.K_PREFIX + k
  return RunName(task, table, row, int(seed))
