"""Runs a table of (row, seed) experiments, resumable, into one output directory.

Layout of `output_dir`:

  table.lock     held by the table's process: a second table on the same folder is refused
  runs/<run>/    a run's workdir, `relpos.experiments.run_names`: config.json, checkpoints, ...
  runs/<run>/result.json   written last: marks the run finished
  runs/<run>/run.log       its process's stdout and stderr (--parallel > 1)
  runs/<run>/failed.json   its error, while a run that failed is not started again
                           (`relpos.experiments.failed_runs`: results.json, table.md, --status)
  results.json   every finished run (rebuilt from the result.json files after each run)
  table.md       made from results.json alone (`relpos.experiments.report`)
  *.png          plots (`relpos.experiments.plots`, `relpos.experiments.plots_learned`)

A finished run (its `result.json` exists) is skipped when its config equals the request in
every field that changes a result (`relpos.config_changes.result_differences`), else the table stops
before any work, naming the field, unless `retrain_changed` moves the run aside to train it
again. A run killed mid-training resumes from its latest checkpoint; its result records every
start and commit and the seconds of all of them. Every file is written to a temporary name and
renamed, so a kill at any point loses only the work in flight.

With `parallel` = 1 the runs train one after another in this process; with N > 1 each run is a
child process (`python -m relpos.experiments.run_one`), up to N at a time, each given 0.9 / N of
the accelerator's memory, the data and tokenizer prepared here first. SIGINT or SIGTERM stops
the children (they save a checkpoint) and returns; a second one kills them.
"""
import contextlib
import dataclasses
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from absl import logging

from relpos import cli
from relpos import config_changes
from relpos import checkpoints
from relpos import run_config as config_lib
from relpos import locks
from relpos import metrics_writer
from relpos import seed_stack
from relpos import source_tree
from relpos import user_modules
from relpos import workdir_files
from relpos.data import pipeline
from relpos.experiments import children
from relpos.experiments import failed_runs
from relpos.experiments import lost_runs
from relpos.experiments import markdown
from relpos.experiments import results
from relpos.experiments import run_names
from relpos.experiments import single_run
from relpos.experiments import tables

# The source tree's root (where `relpos` and `configs` are imported from).
ROOT = source_tree.ROOT
LOG_FILE = "run.log"
TABLE_LOCK_FILE = "table.lock"
# The orders a table's runs can go in: each row's seeds one after another, or each seed's pass
# over the rows before the next seed (a whole table of one seed early).
ORDERS = ("rows", "seeds")


@dataclasses.dataclass(frozen=True)
class Run:
  """One (row, seed) of a table and its workdir."""
  table: str
  row: str
  seed: int
  workdir: str

  @property
  def name(self) -> str:
    return os.path.basename(self.workdir)

  @property
  def log(self) -> str:
    """The file its child process writes its stdout and stderr to."""
    return os.path.join(self.workdir, LOG_FILE)

  @property
  def result(self) -> str:
    """Its result file, written last (atomically): present when the run is finished."""
    return os.path.join(self.workdir, results.RESULT_FILE)


def table_rows(table: str, rows: Sequence[str] | None) -> list[str]:
  """`rows` of `table`, or all of its rows when `rows` is empty.

  A k sweep row is written as its k reads (`k=03` is `k=3`: the same run).

  Raises:
    ValueError: an unknown table, a row not in it (naming the allowed ones), or a row given
      twice (trained twice, one run would count as two seeds).
  """
  if table not in tables.TABLES:
    raise ValueError(f"unknown table {table!r}; allowed: {', '.join(tables.TABLES)}.")
  given = list(rows or tables.TABLES[table])
  rows = [tables.canonical_row(row) for row in given]
  for row in rows:
    if not tables.row_in_table(row, table):
      raise ValueError(f"row {row!r} is not in table {table!r}; allowed: "
                       f"{tables.rows_text(table)}.")
    if rows.count(row) > 1:
      twice = ", ".join(g for r, g in zip(rows, given) if r == row)
      raise ValueError(f"row {row!r} is given more than once in --rows ({twice}).")
  return rows


def table_runs(table: str, task: str, rows: Sequence[str], seeds: Sequence[int], output_dir: str,
               order: str = "rows") -> list[Run]:
  """Every (row, seed) of a table on `task`, with its workdir under `output_dir/runs` (named
  after the task too, so tables of two tasks never share a run).

  Args:
    order: "rows" (each row's seeds one after another) or "seeds" (every row with the first
      seed, then every row with the next).
  """
  runs_dir = os.path.join(os.path.abspath(output_dir), results.RUNS_DIR)
  pairs = ([(row, seed) for row in rows for seed in seeds]
           if order == "rows" else [(row, seed) for seed in seeds for row in rows])
  return [
      Run(table, row, seed, os.path.join(runs_dir, run_names.run_name(task, table, row, seed)))
      for row, seed in pairs
  ]


def prepare_data(runs: Sequence[Run], task: str, overrides: dict[str, Any] | None) -> None:
  """Builds (or opens) the TFDS dataset and the tokenizer of every run's task, once each."""
  for run in runs:
    pipeline.get_task(tables.one_run_config(run.row, run.seed, task, overrides).task)


def _print_finished(result: dict[str, Any], done: int, total: int, started: float) -> None:
  """One line for a finished run: its first test split's BLEU, its wall time, and the time the
  table's remaining runs will take at the pace since `started` (time.monotonic)."""
  split = single_run.EVAL_SPLITS[result["config"]["task"]["name"]][0]
  left = (time.monotonic() - started) / done * (total - done)
  eta = f"; ETA {markdown.duration(left)} for the {total - done} left" if done < total else ""
  print(
      f"relpos: run {done} of {total} finished: {os.path.basename(result['workdir'])} "
      f"({split} BLEU {result['scores'][split]['bleu']:.1f}, {result['wall_time_s']:.0f} s"
      f"{eta})", flush=True)


def _train_stacked(runs: Sequence[Run], task: str,
                   overrides: dict[str, Any] | None) -> dict[Run, dict[str, Any]]:
  """Trains the seeds of one row (`runs`) not finished yet as one program
  (`seed_stack.train_seeds`), holding their run locks; returns what training returned, by run
  (empty for fewer than two seeds: a seed alone trains in `single_run.run_one`)."""
  if len(runs) < 2:
    return {}
  with contextlib.ExitStack() as held:
    for run in runs:
      os.makedirs(run.workdir, exist_ok=True)
      held.enter_context(locks.hold(run.workdir, lock_file=single_run.LOCK_FILE, wait=True))
    runs = [run for run in runs if not os.path.exists(run.result)]  # finished meanwhile
    if len(runs) < 2:
      return {}
    print(f"relpos: training {', '.join(run.name for run in runs)} as one program", flush=True)
    configs = [
        config_lib.validate(tables.one_run_config(run.row, run.seed, task, overrides))
        for run in runs
    ]
    return dict(zip(runs, seed_stack.train_seeds(configs, [run.workdir for run in runs])))


def _run_in_process(runs: Sequence[Run], *, task: str, overrides: dict[str, Any] | None,
                    output_dir: str, publish_to: str | None = None,
                    stack_seeds: bool = False) -> tuple[list[str], bool]:
  """Runs `runs` one after another in this process. A run that fails (a non-finite loss, a
  full disk, a bug) is reported with its error, and the others go on, as children do.

  With `stack_seeds`, a row's seeds are trained as one program (`_train_stacked`) when its
  first is reached, then each is evaluated as it comes.

  Returns:
    ("<run>: <error>" of each run that failed, whether one was preempted).
  """
  started, trained, failed = time.monotonic(), {}, []
  for done, run in enumerate(runs, 1):
    if stack_seeds and run not in trained:
      trained.update(_train_stacked([r for r in runs if r.row == run.row], task, overrides))
    print(f"relpos: training and evaluating {run.workdir}", flush=True)
    failed_runs.clear(run.workdir)
    try:
      result = single_run.run_one(run.table, run.row, run.seed, task, run.workdir, overrides,
                                  trained.get(run))
    except Exception as e:  # pylint: disable=broad-exception-caught  # (not SIGINT, SystemExit)
      if not isinstance(e, cli.USER_ERRORS):
        logging.exception("%s failed:", run.workdir)  # a bug: its traceback
      failed.append(f"{run.name}: {str(e).strip() or type(e).__name__}")
      failed_runs.record(run.workdir, str(e).strip() or type(e).__name__)
      print(f"relpos: run {done} of {len(runs)} failed: {failed[-1]}", flush=True)
      continue
    if result is None:
      logging.warning(
          "Preempted during %s: its checkpoint is saved; rerun the same command to "
          "resume.", run.workdir)
      return failed, True
    _print_finished(result, done, len(runs), started)
    results.write_outputs(output_dir, publish_to)
  return failed, False


def child_command(run: Run, task: str, overrides: dict[str, Any] | None) -> list[str]:
  """The command that trains and evaluates `run` in a process of its own."""
  return [
      sys.executable, "-m", "relpos.experiments.run_one", f"--table={run.table}",
      f"--row={run.row}", f"--seed={run.seed}", f"--task={task}", f"--workdir={run.workdir}",
      *(f"--import={spec}" for spec in user_modules.imported()),
      *(f"--set={tables.format_override(k, v)}" for k, v in (overrides or {}).items())
  ]


def _run_children(runs: Sequence[Run], *, task: str, overrides: dict[str, Any] | None,
                  output_dir: str, parallel: int,
                  publish_to: str | None = None) -> tuple[list[Run], bool]:
  """Runs `runs` as child processes (`children.run_all`), up to `parallel` at once;
  results.json is rebuilt after each finished one. A child that fails is reported with its
  log, and the others go on.

  Returns:
    (the runs whose process ended without a result, whether SIGINT or SIGTERM stopped them).
  """
  failed, started = [], time.monotonic()

  def ended(run: Run, returncode: int, done: int) -> None:
    if os.path.exists(run.result):
      _print_finished(results.read_result(run.result), done, len(runs), started)
      results.write_outputs(output_dir, publish_to)
    else:
      failed.append(run)
      if returncode != 0:  # 0: stopped by a signal, its checkpoint saved
        failed_runs.record(run.workdir, children.failure(returncode), log=run.log)
      print(
          f"relpos: run {done} of {len(runs)} failed: {run.name} "
          f"({children.failure(returncode)}); log: {run.log}", flush=True)

  def start(run: Run) -> list[str]:
    failed_runs.clear(run.workdir)
    return child_command(run, task, overrides)

  stopped = children.run_all(runs, command=start, env=children.environment(parallel, ROOT),
                             parallel=parallel, ended=ended)
  return failed, stopped


def _saved_config(run: Run) -> tuple[str, config_lib.RunConfig] | None:
  """(the file, the config) a run was made with (its result.json) or, unfinished, trained its
  checkpoints with (its config.json); None for a run that has neither (it starts afresh)."""
  if os.path.exists(run.result):
    saved = results.read_result(run.result)["config"]  # names the file when it is damaged
    try:
      return run.result, config_lib.validate(saved)
    except ValueError as e:
      raise ValueError(f"{run.result}: {e}") from None
  started = os.path.join(run.workdir, workdir_files.CONFIG_FILE)
  if not os.path.exists(started) or checkpoints.newest_step(run.workdir) is None:
    return None
  return started, config_lib.read(started)


def _code_differences(run: Run, finished: bool, position: str) -> list[tuple[str, Any, Any]]:
  """[(what, before, now)] when the run's position variant is a user's own whose file was
  edited since its last start (`user_modules.variant_code_change`), else []."""
  starts = (results.read_result(run.result).get("starts", [])
            if finished else metrics_writer.read_starts(run.workdir))
  if (change := user_modules.variant_code_change(starts, position)) is None:
    return []
  before, now = change
  return [(f"the code of position variant {position!r} ({now['file']})", f"sha256:{before[:12]}",
           f"sha256:{now['sha256'][:12]}")]


def _move_aside(run: Run) -> str:
  """Renames a run's workdir to `<workdir>.replaced-<UTC time>` (kept, never deleted)."""
  stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
  aside = f"{run.workdir}{results.REPLACED_MARK}{stamp}"
  os.rename(run.workdir, aside)
  return aside


def _check_one_task(output_dir: str, task: str) -> None:
  """Refuses an output folder that holds runs of another task (a table has one task).

  Raises:
    ValueError: naming the folder, the other task and one of its runs.
  """
  runs_dir = os.path.join(output_dir, results.RUNS_DIR)
  for name in sorted(os.listdir(runs_dir)) if os.path.isdir(runs_dir) else []:
    try:
      run = results.read_result(os.path.join(runs_dir, name, results.RESULT_FILE))
    except (OSError, ValueError):  # unfinished, or reported where the table reads it
      continue
    if run["task"] != task:
      other = results.workdir_of(run, output_dir)
      raise ValueError(f"{output_dir} holds runs of task {run['task']!r} ({other}), "
                       f"not {task!r}: a table has one task; pass another --output_dir.")


def check_made_alike(output_dir: str, runs: Sequence[Run], task: str,
                     overrides: dict[str, Any] | None) -> None:
  """Refuses a request made otherwise than the finished runs of other rows or seeds already in
  `output_dir`, which its table.md would compare with the new ones (an `abs` of 1,000 steps
  beside a `rel_kv` of 2,000, or seeds of one row made with two values of a field it sets).
  Each is compared with the config this request would give its own row and seed, so only the
  seed and the neutral fields may differ; a run whose config no longer validates (a variant of
  one's own not imported) is not compared.

  Raises:
    ValueError: naming the finished run's result.json, the first field and both values.
  """
  requested_runs = {os.path.abspath(run.workdir) for run in runs}
  for other in results.collect(output_dir):
    workdir = os.path.abspath(results.workdir_of(other, output_dir))
    if workdir in requested_runs:
      continue  # compared with its own request (`pending_runs`)
    try:
      saved = config_lib.validate(other["config"])
      requested = config_lib.validate(
          tables.one_run_config(other["row"], other["seed"], task, overrides))
    except ValueError:
      continue
    differences = config_changes.result_differences(saved, requested)
    if differences:
      field, before, asked = differences[0]
      raise ValueError(
          f"{os.path.join(workdir, results.RESULT_FILE)} was made with {field}={before!r}, not "
          f"the {asked!r} asked for this table's other runs: a table compares runs made alike; "
          "run with that setting, or pass another --output_dir.")


def pending_runs(runs: Sequence[Run], *, task: str, overrides: dict[str, Any] | None,
                 retrain_changed: bool, output_dir: str | None = None) -> list[Run]:
  """The runs of `runs` to train, in order: the unfinished ones, and those finished or started
  with a config that differs from the request in a field that changes a result (with
  `retrain_changed`: moved aside, to train from the start). An unfinished run resumed with
  another learning rate or budget would be neither run, and its result.json would name only
  the second config. A position variant of the user's own whose file was edited since the
  run's last start counts as such a field (`_code_differences`). With `output_dir`, the other
  finished runs there are checked to be made alike (`check_made_alike`) before any run is
  moved aside.

  Raises:
    ValueError: (not `retrain_changed`) a run made or started with a config that differs from
      the request in a field that changes its result, naming the file, the field and both
      values; what `check_made_alike` raises.
  """
  decisions = []  # (run, what moving it aside says, or None to train it as it is)
  for run in runs:
    made_with = _saved_config(run)
    if made_with is None:
      decisions.append((run, None))
      continue
    path, saved_config = made_with
    requested = config_lib.validate(tables.one_run_config(run.row, run.seed, task, overrides))
    finished = path == run.result
    differences = [
        *config_changes.result_differences(saved_config, requested),
        *_code_differences(run, finished, requested.model.position)
    ]
    if not differences:
      if finished:
        print(f"relpos: {run.workdir} is finished; skipping it.", flush=True)
      else:
        decisions.append((run, None))
      continue
    field, saved, asked = differences[0]
    more = f" (and {len(differences) - 1} more fields)" if len(differences) > 1 else ""
    made = "made" if finished else "started"
    if not retrain_changed:
      raise ValueError(f"{path} was {made} with {field}={saved!r}, not the {asked!r} asked"
                       f"{more}: pass --retrain_changed to train it again (its folder is kept "
                       "aside), or use another --output_dir.")
    decisions.append((run, f"was {made} with {field}={saved!r}, not {asked!r}{more}"))
  if output_dir is not None:
    check_made_alike(output_dir, runs, task, overrides)
  for run, changed in decisions:
    if changed:
      print(f"relpos: {run.workdir} {changed}; moved it to {_move_aside(run)} to train it again.",
            flush=True)
  return [run for run, _ in decisions]


def run_table(table: str, *, task: str, seeds: Sequence[int], output_dir: str,
              rows: Sequence[str] | None = None, overrides: dict[str, Any] | None = None,
              parallel: int = 1, order: str = "rows", retrain_changed: bool = False,
              stack_seeds: bool = False, restore_from: str | None = None,
              publish_to: str | None = None) -> dict[str, Any]:
  """Trains and evaluates every (row, seed) of a table not finished yet in `output_dir`.

  Args:
    table: a name of `tables.TABLES`.
    task: one of tables.TASKS (its base config a file of configs/).
    seeds: the seeds to run each row with.
    output_dir: where runs, results.json, table.md and plots go (resumable).
    rows: a subset of the table's rows (default all).
    overrides: dotted fields set on every run over `tables.TABLE_FIELDS`: {"train.num_steps": 9}.
    parallel: how many runs at once; above 1 each is a child process (module docstring).
    order: one of ORDERS: "rows" (a row's seeds one after another) or "seeds" (every row
      with one seed before the next seed).
    retrain_changed: train again (after moving them aside) the finished runs whose config
      differs from the request in a field that changes a result; without it such a run stops
      the table before any work.
    stack_seeds: (with `parallel` = 1) train each row's pending seeds as one program
      (`relpos.seed_stack`): the same runs and results, one compiled step over the seeds.
    restore_from: a results.json of this table published elsewhere (e.g. under docs/results/):
      its finished runs whose folders `output_dir` lacks are written back as finished
      (`results.restore_published`) before the table goes on; their configs are checked
      against the request like any finished run's; then the runs its folder's in_flight.json
      lists as training whose folders are missing are recorded lost (`lost_runs.record_losses`).
    publish_to: a folder (e.g. docs/results/<table>/) to copy results.json, table.md, the plots
      and the runs' test translations into after each finished run (`results.publish`).

  Returns:
    results.write_outputs()'s paths and the table markdown, "preempted" (whether SIGTERM, or with
    `parallel` > 1 SIGINT, stopped the table) and "failed" ("<run>: <error>" of each run that
    ended without a result; "<run>: see <its log>" for a child process).

  Raises:
    ValueError: for an unknown table, row or order, an invalid override (or one that changes
      a field a row sets: `tables.check_overrides`), no seeds, `parallel`
      < 1 (or > 1 with `stack_seeds`), an output folder holding runs of another task, a
      finished run made with another config (see `pending_runs`), a `restore_from` that is
      not a results.json, or a `publish_to` folder that cannot be written.
    locks.WorkdirInUseError: another table runs in `output_dir`.
  """
  if not seeds:
    raise ValueError("no seeds to run: --seeds must be at least 1.")
  if parallel < 1:
    raise ValueError(f"parallel={parallel}: must be at least 1.")
  if stack_seeds and parallel > 1:
    raise ValueError(f"stack_seeds trains a row's seeds in this process: not with "
                     f"parallel={parallel}.")
  if order not in ORDERS:
    raise ValueError(f"order={order!r}: allowed: {', '.join(ORDERS)}.")
  rows, overrides = table_rows(table, rows), tables.with_table_fields(table, task, overrides)
  tables.check_overrides(rows, overrides)
  for row in rows:  # every config valid before any work
    config_lib.validate(tables.one_run_config(row, seeds[0], task, overrides))
  if os.path.exists(output_dir) and not os.path.isdir(output_dir):
    raise ValueError(f"--output_dir {output_dir} exists and is not a folder.")
  os.makedirs(output_dir, exist_ok=True)
  if publish_to:  # a folder it cannot write stops the table before any work, not after a run
    results.check_writable(publish_to)
  with locks.hold(
      output_dir, lock_file=TABLE_LOCK_FILE, what="output folder",
      busy="another table runs there; wait for it to end (or stop it), or pass "
      "another --output_dir"):
    runs = table_runs(table, task, rows, seeds, output_dir, order)
    if restore_from:
      for workdir in results.restore_published(restore_from, output_dir, table=table, task=task):
        print(
            f"relpos: {workdir} restored as finished from {restore_from} (its result and "
            "the test translations published with it, not its checkpoints).", flush=True)
      runs_dir = os.path.join(output_dir, results.RUNS_DIR)
      for line in lost_runs.record_losses(os.path.dirname(restore_from), runs_dir, output_dir):
        print(f"relpos: {line}", flush=True)
    if publish_to:
      results.check_publish_keeps(publish_to, output_dir, table=table, task=task)
    _check_one_task(output_dir, task)
    pending = pending_runs(runs, task=task, overrides=overrides, retrain_changed=retrain_changed,
                           output_dir=output_dir)
    prepare_data(pending, task, overrides)  # once, before any run starts
    if parallel == 1:
      failed, preempted = _run_in_process(pending, task=task, overrides=overrides,
                                          output_dir=output_dir, publish_to=publish_to,
                                          stack_seeds=stack_seeds)
    else:
      failed_children, preempted = _run_children(pending, task=task, overrides=overrides,
                                                 output_dir=output_dir, parallel=parallel,
                                                 publish_to=publish_to)
      failed = [f"{run.name}: see {run.log}" for run in failed_children]
    return {
        **results.write_outputs(output_dir, publish_to), "preempted": preempted, "failed": failed
    }
