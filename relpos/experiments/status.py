"""Where a table stands, read from its output folder while it runs: whether a table process holds
the folder, and for each planned run its state, its last logged step, the checkpoint a restart
resumes from, its best validation BLEU (once finished, the selected checkpoint's, as table.md gives
it), once finished its test BLEU, and while it runs its training time left at its recent pace; then
the time the runs not finished need at the finished runs' median time. A run written back from
published results (`--restore_from`) is "finished (restored)", with no step or checkpoint of its
own; a run that failed (`relpos.experiments.failed_runs`) is "failed", its error under the table.

Nothing is locked or loaded onto a device, and nothing written but, with --publish_to, the runs
in flight there (`publish_in_flight`) (`python -m relpos.experiments.run ... --status`: the
table's own command, with --status added):

  Table ablation on multi30k_gpu in /runs/m30k: running (process 10923 on host vm, ...).
  1 of 3 runs finished, 1 running, 1 not started.

  run                               state        step       checkpoint  best validation BLEU  ...
  multi30k_gpu-ablation-abs-seed0   finished     8000/8000  8000        41.0 at 8000          ...
  multi30k_gpu-ablation-none-seed0  running      4300/8000  4300        27.6 at 4000          ...
  multi30k_gpu-ablation-abs-seed1   not started  -          -           -                     ...
"""
import dataclasses
import datetime
import os
import statistics
import time
from collections.abc import Sequence
from typing import Any

from relpos import checkpoints
from relpos import json_files
from relpos import user_modules
from relpos import locks
from relpos import metrics_writer
from relpos import workdir_files
from relpos.experiments.markdown import duration
from relpos.experiments import failed_runs
from relpos.experiments import lost_runs
from relpos.experiments import results
from relpos.experiments import run_names
from relpos.experiments import runner
from relpos.experiments import single_run
from relpos.experiments import tables
from relpos.experiments import verdicts

# A run's states: its result.json written; a process holds its run or train lock (training or
# evaluating); it failed (`failed_runs`) and was not started since; its folder exists (a
# restart resumes it from its newest checkpoint); no folder. A failed or stopped run resumes
# from its newest checkpoint when the table's command runs again.
STATES = ("finished", "running", "failed", "stopped", "not started")


@dataclasses.dataclass(frozen=True)
class RunStatus:
  """One planned run of a table, as its folder shows it."""
  name: str
  state: str  # one of STATES
  step: int | None = None  # the last train record's step
  num_steps: int | None = None  # its config's train.num_steps
  checkpoint: int | None = None  # the newest checkpoint's step: where a restart resumes
  # The best validation so far, (step, BLEU); once finished, the selected checkpoint's.
  validation: tuple[int, float] | None = None
  test: tuple[str, float] | None = None  # finished: (the main test split, its BLEU)
  updated: float | None = None  # when its metrics (or result) were last written, epoch seconds
  steps_per_second: float | None = None  # over its last RECENT_RECORDS train records
  wall_time_s: float | None = None  # finished: the seconds it took, over all its starts
  # Finished elsewhere: its result written back from a published results.json (`--restore_from`),
  # without its checkpoints.
  restored: bool = False


# The train records whose steps per second give a running run's training time left.
RECENT_RECORDS = 5


def run_status(run: runner.Run) -> RunStatus:
  """The state of `run` read from its folder.

  Raises:
    ValueError: its metrics.jsonl, config.json or result.json is not readable, naming it.
  """
  if not os.path.isdir(run.workdir):
    return RunStatus(run.name, "not started")
  records = metrics_writer.read_metrics(run.workdir)
  trained = [r["step"] for r in records if r["split"] == "train"]
  speeds = [
      r["steps_per_second"] for r in records if r["split"] == "train" and r.get("steps_per_second")
  ][-RECENT_RECORDS:]
  validations = [(r["step"], r["bleu"])
                 for r in records
                 if r["split"] == "validation" and r.get("bleu") is not None]
  config_path = os.path.join(run.workdir, workdir_files.CONFIG_FILE)
  num_steps = (json_files.read_json(config_path)["train"]["num_steps"]
               if os.path.exists(config_path) else None)
  metrics_path = os.path.join(run.workdir, workdir_files.METRICS_FILE)
  updated = os.path.getmtime(metrics_path) if os.path.exists(metrics_path) else None
  # The newest of the highest: the checkpoint --checkpoint=best restores (Orbax ranks equal
  # metrics by step and takes the last), and the one kept while others are deleted.
  best = max(validations, key=lambda validation: (validation[1], validation[0]), default=None)
  test, wall_time_s, restored = None, None, False
  if os.path.exists(run.result):
    state, result = "finished", results.read_result(run.result)
    split = verdicts.main_test_split([result])
    test = (split, result["scores"][split]["bleu"]) if split in result["scores"] else None
    selected = result["scores"].get("validation", {})
    if "step" in selected and "bleu" in selected:
      best = (selected["step"], selected["bleu"])
    updated, wall_time_s = os.path.getmtime(run.result), result.get("wall_time_s")
    restored = "restored" in result
    finished_at = result.get("environment", {}).get("finished_at")
    if restored and finished_at:  # when it finished, not when it was written back
      updated = datetime.datetime.fromisoformat(finished_at).timestamp()
  elif (locks.holder(run.workdir, single_run.LOCK_FILE) or
        locks.holder(run.workdir, workdir_files.LOCK_FILE)):
    state = "running"
  else:
    state = "failed" if failed_runs.read(run.workdir) is not None else "stopped"
  return RunStatus(run.name, state, step=max(trained, default=None), num_steps=num_steps,
                   checkpoint=checkpoints.newest_step(run.workdir), validation=best, test=test,
                   updated=updated, steps_per_second=sum(speeds) / len(speeds) if speeds else None,
                   wall_time_s=wall_time_s, restored=restored)


def _cell(value: object) -> str:
  return "-" if value is None else str(value)


def _row(status: RunStatus) -> list[str]:
  step = None if status.step is None else f"{status.step}/{_cell(status.num_steps)}"
  validation = (None if status.validation is None else
                f"{status.validation[1]:.1f} at {status.validation[0]}")
  updated = (None if status.updated is None else time.strftime("%Y-%m-%d %H:%M UTC",
                                                               time.gmtime(status.updated)))
  test = None if status.test is None else f"{status.test[1]:.1f}"
  left = None
  if status.state == "running" and status.steps_per_second and status.num_steps:
    left = duration((status.num_steps - status.step) / status.steps_per_second)
  return [
      status.name, f"{status.state} (restored)" if status.restored else status.state,
      _cell(step),
      _cell(status.checkpoint),
      _cell(validation),
      _cell(test),
      _cell(updated),
      _cell(left)
  ]


def _aligned(rows: list[list[str]]) -> list[str]:
  widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
  return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def inferred_note(output_dir: str) -> str:
  """Said under a report whose table, task, rows or seeds were read from the folder's runs."""
  return (f"The table, task, rows and seeds not given were read from the names of the runs in "
          f"{os.path.join(output_dir, results.RUNS_DIR)}: a row or seed not started yet is not "
          f"among them (the table's own command with --status shows it).")


def table_in_folder(output_dir: str, *, table: str | None = None,
                    task: str | None = None) -> dict[str, Any] | None:
  """{"table", "task", "rows", "seeds" (their number)} of the runs in `output_dir`'s runs/
  folder, read from their names (`relpos.experiments.run_names`; those of `table` and `task`
  where given): rows in the table's order, seeds 0 to the highest found.
  None where no run is there.

  Raises:
    ValueError: runs of several tables or tasks, naming them and the flags that choose one.
  """
  runs_dir = os.path.join(output_dir, results.RUNS_DIR)
  found = []
  for name in os.listdir(runs_dir) if os.path.isdir(runs_dir) else []:
    parsed = run_names.parse_run_name(name)
    if (parsed and parsed.table in tables.TABLES and table in (None, parsed.table) and
        task in (None, parsed.task)):
      found.append(parsed)
  kinds = sorted({(run.task, run.table) for run in found})
  if not kinds:
    return None
  if len(kinds) > 1:
    raise ValueError(f"{runs_dir} holds runs of several tables: "
                     f"{', '.join(f'{b} on {a}' for a, b in kinds)}; choose one with --table "
                     f"and --task.")
  task, table = kinds[0]
  present = {run.row for run in found}
  if table == "k_sweep":
    rows = sorted(present, key=lambda row: int(row.removeprefix(tables.K_PREFIX)))
  else:
    # A variant of one's own not imported here is left out (the report names its runs apart).
    rows = [row for row in tables.TABLES[table] + tables.more_rows(table) if row in present]
  return {
      "table": table, "task": task, "rows": rows or list(tables.TABLES[table]),
      "seeds": max(run.seed for run in found) + 1
  }


def _time_left(statuses: Sequence[RunStatus], took: Sequence[float]) -> str:
  """" The N runs not finished need about T more ...": the finished runs' median time (`took`,
  seconds) for each, less the share of its steps each has trained; "" when none is left."""
  left = [s for s in statuses if s.state != "finished"]
  if not left:
    return ""
  median = statistics.median(took)
  trained = lambda s: min(s.step / s.num_steps, 1.0) if s.step and s.num_steps else 0.0
  need = sum(median * (1.0 - trained(s)) for s in left)
  runs = f"{len(left)} runs not finished need" if len(left) > 1 else "run not finished needs"
  return (f" The {runs} about {duration(need)} more (the finished runs' median, "
          f"{duration(median)} a run, less the steps each has trained).")


def publish_in_flight(destination: str, runs: Sequence[runner.Run], output_dir: str) -> str | None:
  """Writes `lost_runs.IN_FLIGHT_FILE` into `destination` (the table's --publish_to folder): the
  runs of `runs` begun and not finished, each with its last step and newest checkpoint, so that
  a restart with --restore_from after the output folder is lost records them as trained again;
  the runs it listed before stay unless finished or among `runs` in their folders.

  Returns:
    The file's path; None where no run is in flight and none was published.
  """
  statuses = [run_status(run) for run in runs]
  runs_dir = os.path.join(output_dir, results.RUNS_DIR)
  finished = {
      name for name in (os.listdir(runs_dir) if os.path.isdir(runs_dir) else [])
      if os.path.exists(os.path.join(runs_dir, name, results.RESULT_FILE))
  }
  return lost_runs.write_in_flight(
      destination, output_dir,
      [{"run": s.name, "step": s.step, "checkpoint": s.checkpoint, "num_steps": s.num_steps}
       for s in statuses
       if s.state in ("running", "failed", "stopped")],
      finished | {s.name for s in statuses if s.state != "not started"})


def _lost_lines(runs: Sequence[runner.Run], output_dir: str) -> list[str]:
  """A line naming each run of `runs` trained again from step 0 after its folder was lost (the
  losses `lost_runs` records in `output_dir`, and a finished run's in its result)."""
  entries = [{
      **(results.read_result(run.result) if os.path.exists(run.result) else {}), "workdir":
          run.workdir
  } for run in runs]
  lost_runs.attach(entries, output_dir)
  lost = [
      f"{run.name} ({'; '.join(map(lost_runs.describe, entry['lost']))})"
      for run, entry in zip(runs, entries)
      if entry.get("lost")
  ]
  return [
      "", "Trained again from step 0 after their folder was lost, each having reached: " +
      ", ".join(lost) + "."
  ] if lost else []


def report(table: str, task: str, runs: Sequence[runner.Run], output_dir: str) -> str:
  """The table's state in `output_dir` and one line per run of `runs` (in their order), a
  warning when a run is running and this machine is loaded (`metrics_writer.is_loaded`), then
  the runs in the folder that `runs` does not name (another --rows or --seeds)."""
  table_holder = locks.holder(output_dir, runner.TABLE_LOCK_FILE)
  running = f"running ({table_holder})" if table_holder else "not running"
  statuses = [run_status(run) for run in runs]
  counts = ", ".join(f"{sum(s.state == state for s in statuses)} {state}" for state in STATES[1:]
                     if any(s.state == state for s in statuses))
  finished = sum(s.state == "finished" for s in statuses)
  splits = [s.test[0] for s in statuses if s.test]
  header = [
      "run", "state", "step", "checkpoint", "best validation BLEU",
      f"{splits[0] if splits else 'test'} BLEU", "updated", "training left"
  ]
  lines = [
      f"Table {table} on {task} in {os.path.abspath(output_dir)}: {running}.",
      f"{finished} of {len(statuses)} runs finished" + (f", {counts}." if counts else "."), "",
      *_aligned([header] + [_row(s) for s in statuses])
  ]
  took = sorted(s.wall_time_s for s in statuses if s.wall_time_s)
  if took:
    each = (duration(took[0]) if len(took) == 1 else f"{duration(took[0])} to {duration(took[-1])}")
    lines += [
        "", f"The finished runs took {each} each (all their starts); a running run's "
        "training left is at the pace of its last steps." + _time_left(statuses, took)
    ]
  load, cpus = metrics_writer.load_average(), metrics_writer.usable_cpus()
  if (any(s.state == "running" for s in statuses) and load is not None and
      metrics_writer.is_loaded(load, cpus)):
    lines += [
        "", f"This machine's load average is {load:.1f} on {cpus} cores: a run here is timed "
        "beside other work now (table.md's machine load; the speed finding is judged only on "
        "runs timed alone)."
    ]
  lines += _lost_lines(runs, output_dir)
  failed = [f for f in results.collect_failed(output_dir) if f["run"] in {r.name for r in runs}]
  lines += ["", failed_runs.note(failed)] if failed else []
  runs_dir = os.path.join(output_dir, results.RUNS_DIR)
  planned = {run.name for run in runs}
  others = sorted(n for n in (os.listdir(runs_dir) if os.path.isdir(runs_dir) else [])
                  if n not in planned and results.REPLACED_MARK not in n)
  if others:
    named = ", ".join(_other_run(runs_dir, name) for name in others)
    lines += ["", f"Also in {runs_dir}, not in these rows and seeds: {named}."]
  return "\n".join(lines)


def _other_run(runs_dir: str, name: str) -> str:
  """`name`, a run folder outside the report's rows and seeds; where its row is a variant of
  one's own that this process has not imported, with the modules its run recorded: the table's
  command counts it only with them (--import)."""
  parsed = run_names.parse_run_name(name)
  if parsed is None or parsed.row in tables.ROWS or parsed.row in tables.variant_rows():
    return name
  try:
    modules = user_modules.recorded_imports(os.path.join(runs_dir, name))
  except ValueError:  # a damaged imports.json: the run itself will say so
    return name
  imports = " ".join(f"--import={module}" for module in modules)
  return f"{name} (made with {imports}: add it to count its row)" if modules else name
