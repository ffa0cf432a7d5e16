"""Runs a table of (row, seed) experiments, resumable, into one output directory.

Layout of `output_dir`:

  table.lock     held by the table's process: a second table on the same folder is refused
  runs/<task>-<table>-<row>-seed<seed>/   the run's workdir (config.json, checkpoints, metrics)
  runs/<task>-<table>-<row>-seed<seed>/result.json   written last: marks the run finished
  runs/<task>-<table>-<row>-seed<seed>/run.log   its process's stdout and stderr (--parallel > 1)
  results.json   every finished run (rebuilt from the result.json files after each run)
  table.md       made from results.json alone (`relpos.experiments.report`)
  *.png          plots (`relpos.experiments.plots`, `relpos.experiments.analysis`)

A finished run (its `result.json` exists) is skipped when its config equals the request in
every field that changes a result (`config_validation.result_differences`); otherwise the table
stops before any work, naming the field, unless `retrain_changed` moves the run aside to train
it again. An interrupted table resumes where it stopped: a run killed mid-training resumes from
its own latest checkpoint, and its result records every start and commit it ran under and the
seconds of all of them. Every file is written to a temporary name and renamed, so a kill at any
point loses only the work in flight.

With `parallel` = 1 the runs train one after another in this process. With `parallel` = N > 1
each run is a child process (`python -m relpos.experiments.run_one`), up to N at a time, each
given 0.9 / N of the accelerator's memory; the data and tokenizer are prepared here first, so
the children only read them. SIGINT or SIGTERM stops the children (they save a checkpoint) and
returns; a second one kills them.
"""
import json
import dataclasses
import datetime
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

import flax
import jax
import ml_collections
import numpy as np
from flax import nnx
from absl import logging

from relpos import config_validation
from relpos import device_mesh
from relpos import evaluate
from relpos import json_files
from relpos import locks
from relpos import metrics_writer
from relpos import preemption
from relpos import source_tree
from relpos import train
from relpos import user_modules
from relpos.data import pipeline
from relpos.experiments import analysis
from relpos.experiments import children
from relpos.experiments import diagnostics
from relpos.experiments import plots
from relpos.experiments import report
from relpos.experiments import tables

# Held-out splits scored per dataset (`config.task.name`).
EVAL_SPLITS = {"synthetic": ("test", "test_long"), "multi30k": ("test_2016_flickr",),
               "wmt14": ("test",)}
ANALYSIS_SENTENCES = 128
# The source tree's root (where `relpos` and `configs` are imported from).
ROOT = source_tree.ROOT
RESULT_FILE = "result.json"
LOG_FILE = "run.log"
LOCK_FILE = "run.lock"
TABLE_LOCK_FILE = "table.lock"
# A run trained again with --retrain_changed is first renamed <workdir><REPLACED_MARK><time>.
REPLACED_MARK = ".replaced-"
# The orders a table's runs can go in: each row's seeds one after another, or each seed's pass
# over the rows before the next seed (a whole table of one seed early).
ORDERS = ("rows", "seeds")


# The source-length buckets of every per-length figure (`diagnostics.source_length_bins`).
length_edges = diagnostics.length_edges
bleu_by_source_length = diagnostics.bleu_by_source_length


def environment() -> dict[str, Any]:
  """The software and devices results are made with: jax and flax versions, device kind
  (e.g. "cpu", "NVIDIA H200") and count."""
  devices = jax.devices()
  return {"jax_version": jax.__version__, "flax_version": flax.__version__,
          "device_kind": devices[0].device_kind, "device_count": len(devices)}


def _now() -> str:
  """The current UTC time, ISO 8601 to the second."""
  return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def train_steps_per_second(workdir: str) -> float | None:
  """Median training steps per second over the run's logged intervals (compilation and
  evaluation time excluded); None when no interval was timed."""
  speeds = [r["steps_per_second"] for r in metrics_writer.read_metrics(workdir)
            if r["split"] == "train" and r.get("steps_per_second") is not None]
  return float(np.median(speeds)) if speeds else None


def validation_curve(workdir: str) -> list[list[float]]:
  """[[step, validation BLEU], ...] of the run's metrics.jsonl, in step order (a step logged
  again after a resume keeps its last record)."""
  by_step = {r["step"]: r["bleu"] for r in metrics_writer.read_metrics(workdir)
             if r["split"] == "validation" and "bleu" in r}
  return [[step, by_step[step]] for step in sorted(by_step)]


def score_checkpoint(workdir: str, config: ml_collections.ConfigDict, task: pipeline.Task,
                     checkpoint: str, mesh: jax.sharding.Mesh
                     ) -> tuple[nnx.Module, dict[str, dict], dict[str, dict], dict[str, dict]]:
  """Scores one checkpoint choice of a run ("best", "latest", "average:N") on the validation
  split and every evaluation split of its task.

  Returns:
    (the restored model, split -> sacreBLEU/chrF scores with the checkpoint's "step",
     split -> BLEU by source-length bucket (test splits),
     split -> `diagnostics.length_statistics` of the translations (test splits)).
  """
  model, step = evaluate.restore_model(workdir, config, checkpoint, mesh)
  scores, by_length, lengths = {}, {}, {}
  for split in ("validation",) + EVAL_SPLITS[config.task.name]:
    scored = evaluate.score_split(model, task, split, config, mesh=mesh)
    translations = scored.pop("translations")
    scores[split] = {**scored, "step": step}
    if split != "validation":
      sources, references = task.source_texts(split), task.target_texts(split)
      by_length[split] = bleu_by_source_length(sources, translations, references)
      lengths[split] = diagnostics.length_statistics(task.tokenizer, sources, translations,
                                                     references)
  return model, scores, by_length, lengths


def length_diagnostics(model: nnx.Module, config: ml_collections.ConfigDict,
                       task: pipeline.Task, mesh: jax.sharding.Mesh) -> dict[str, Any]:
  """The length diagnostics of `relpos.experiments.diagnostics` on every test split.

  Returns:
    {"oracle_length": split -> scores at the references' lengths (with
     "bleu_by_source_length"), "token_accuracy_by_position": split -> teacher-forced accuracy
     by target position (up to 2 x task.max_length), "attention_profile": split -> the
     encoder's attention on up to ANALYSIS_SENTENCES of its sources}.
  """
  out = {"oracle_length": {}, "token_accuracy_by_position": {}, "attention_profile": {}}
  for split in EVAL_SPLITS[config.task.name]:
    out["oracle_length"][split] = diagnostics.oracle_length_scores(model, task, split, config,
                                                                  mesh=mesh)
    out["token_accuracy_by_position"][split] = diagnostics.token_accuracy_by_position(
        model, task, split, batch_size=config.train.eval_batch_size,
        num_positions=2 * config.task.max_length)
    sources = task.source_texts(split)[:ANALYSIS_SENTENCES]
    _, inputs = next(evaluate.source_batches(task.tokenizer, sources, len(sources)))
    out["attention_profile"][split] = analysis.attention_profile(model, inputs)
  return out


def evaluate_run(workdir: str) -> dict[str, Any]:
  """Scores a run's `decode.checkpoint` (the best by validation BLEU unless set to 'latest' or
  'average:N') on every evaluation split of its task, and each of `decode.other_checkpoints`,
  with the length diagnostics of `length_diagnostics` when `decode.length_diagnostics`.

  Returns:
    {"scores": split -> sacreBLEU/chrF scores, "bleu_by_source_length": split -> BLEU by
     source-length bucket (test splits), "length_statistics": split -> hypothesis/reference
     length ratio and early/late stops (test splits), "other_checkpoints": choice -> split ->
     scores, "position_statistics": the encoder's on up to ANALYSIS_SENTENCES validation
     sources, "num_params": the model's number of parameters, and `length_diagnostics`'s
     "oracle_length", "token_accuracy_by_position", "attention_profile"}.
  """
  config = evaluate.load_run_config(workdir)
  mesh = device_mesh.make_mesh()
  task = pipeline.get_task(config.task)
  model, scores, by_length, lengths = score_checkpoint(workdir, config, task,
                                                       config.decode.checkpoint, mesh)
  others = {choice: score_checkpoint(workdir, config, task, choice, mesh)[1]
            for choice in config_validation.other_checkpoints(config)}
  sources = task.source_texts("validation")[:ANALYSIS_SENTENCES]
  _, inputs = next(evaluate.source_batches(task.tokenizer, sources, len(sources)))
  num_params = sum(p.size for p in jax.tree.leaves(nnx.state(model, nnx.Param)))
  return {"scores": scores, "bleu_by_source_length": by_length, "length_statistics": lengths,
          "other_checkpoints": others,
          "position_statistics": analysis.position_statistics(model, inputs),
          "num_params": num_params,
          **(length_diagnostics(model, config, task, mesh)
             if config.decode.length_diagnostics else {})}


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
    return os.path.join(self.workdir, RESULT_FILE)


def table_runs(table: str, task: str, rows: Sequence[str], seeds: Sequence[int],
               output_dir: str, order: str = "rows") -> list[Run]:
  """Every (row, seed) of a table on `task`, with its workdir under `output_dir/runs` (named
  after the task too, so tables of two tasks never share a run).

  Args:
    order: "rows" (each row's seeds one after another) or "seeds" (every row with the first
      seed, then every row with the next).
  """
  runs_dir = os.path.join(os.path.abspath(output_dir), "runs")
  pairs = ([(row, seed) for row in rows for seed in seeds] if order == "rows"
           else [(row, seed) for seed in seeds for row in rows])
  return [Run(table, row, seed,
              os.path.join(runs_dir, f"{task}-{table}-{row.replace('=', '')}-seed{seed}"))
          for row, seed in pairs]


class StopRequested(Exception):
  """SIGTERM arrived while a run was being evaluated (after its training was saved)."""


def _raise_stop(_: str) -> None:
  raise StopRequested()


def run_one(table: str, row: str, seed: int, task: str, workdir: str,
            overrides: dict[str, Any] | None = None) -> dict[str, Any] | None:
  """Trains and evaluates one run; returns (and writes) its result record.

  One process at a time runs in a workdir: this waits for the workdir's run lock, then returns
  the result already there when another process finished the run meanwhile.

  Returns None, writing nothing, when SIGTERM stopped it: during training after its checkpoint,
  during the final evaluation at once (its training is saved; a rerun evaluates it).
  """
  config = tables.run_config(row, seed, task, overrides)
  os.makedirs(workdir, exist_ok=True)
  with locks.hold(workdir, lock_file=LOCK_FILE, wait=True):
    if os.path.exists(os.path.join(workdir, RESULT_FILE)):
      return read_result(os.path.join(workdir, RESULT_FILE))
    summary = train.train_and_evaluate(config, workdir)
    if summary["preempted"]:
      return None
    evaluation_start = time.time()
    try:
      with preemption.Preemption(signals=(signal.SIGTERM,), on_signal=_raise_stop):
        evaluation = evaluate_run(workdir)
    except StopRequested:
      logging.warning("Stopped during the final evaluation of %s; its training is saved, and "
                      "running the same command again evaluates it.", workdir)
      return None
    evaluation_s = time.time() - evaluation_start
    records = metrics_writer.read_metrics(workdir)
    training_s = metrics_writer.elapsed_seconds(records)
    validation_s = sum(r.get("time_s") or 0.0 for r in records if r["split"] == "validation")
    starts = metrics_writer.read_starts(workdir)
    result = {
        "table": table, "row": row, "seed": seed, "task": task,
        "k": config.model.max_relative_position if table == "k_sweep" else None,
        "commit": starts[-1]["commit"] if starts else source_tree.commit(),
        # Every start of the run (time, step, commit, host) and the commits in order.
        "starts": starts, "commits": list(dict.fromkeys(s["commit"] for s in starts)),
        # Seconds over every start of the run (`metrics_writer.elapsed_seconds`; compilation
        # is inside each part): training steps and checkpoints, validation during training,
        # the final evaluation of every split (the last one).
        "wall_time_s": training_s + evaluation_s,
        "time_s": {"training": training_s - validation_s, "validation": validation_s,
                   "evaluation": evaluation_s},
        "steps_per_second": train_steps_per_second(workdir),
        "validation_curve": validation_curve(workdir), **evaluation,
        "config": json.loads(config.to_json()), "workdir": os.path.abspath(workdir),
        "environment": {**environment(), "finished_at": _now()},
    }
    json_files.write_json(os.path.join(workdir, RESULT_FILE), result, indent=1)
  return result


# The fields of a run's result that the tables read: a result.json without them is refused.
RESULT_FIELDS = ("table", "row", "seed", "task", "scores", "config", "workdir")


def read_result(path: str) -> dict[str, Any]:
  """A run's result.json.

  Raises:
    ValueError: naming the file when it is not JSON or not a run's result (an object with
      RESULT_FIELDS), and how to evaluate the run again.
  """
  try:
    result = json_files.read_json(path)
  except ValueError as e:
    raise ValueError(f"{str(e).rstrip('.')}: delete it to evaluate that run again.") from None
  missing = ([f for f in RESULT_FIELDS if f not in result] if isinstance(result, dict)
             else list(RESULT_FIELDS))
  if missing or not isinstance(result["scores"], dict):
    raise ValueError(f"{path} is not a run's result (no {(missing or ['scores'])[0]!r}): "
                     "delete it to evaluate that run again.")
  return result


def collect(output_dir: str) -> list[dict[str, Any]]:
  """Every finished run under `output_dir/runs` (not those moved aside), in table and row
  order; a result.json that cannot be read is left out with a warning naming it (the table
  goes on)."""
  runs_dir = os.path.join(output_dir, "runs")
  runs = []
  names = sorted(os.listdir(runs_dir)) if os.path.isdir(runs_dir) else []
  for name in [n for n in names if REPLACED_MARK not in n]:
    path = os.path.join(runs_dir, name, RESULT_FILE)
    if os.path.exists(path):
      try:
        runs.append(read_result(path))
      except ValueError as e:
        logging.warning("Left out of the table: %s", e)
  order = {}
  for key in ((t, r) for t in tables.TABLES for r in (*tables.TABLES[t], *tables.ROWS)):
    order.setdefault(key, len(order))
  return sorted(runs, key=lambda r: (order.get((r["table"], r["row"]), len(order)), r["seed"]))


def write_outputs(output_dir: str) -> dict[str, Any]:
  """results.json from the finished runs, then table.md and the plots from it."""
  results_path = os.path.join(output_dir, "results.json")
  json_files.write_json(results_path, {"schema_version": report.RESULTS_SCHEMA_VERSION,
                                    "written_at": _now(), **environment(),
                                    "runs": collect(output_dir)}, indent=1)
  table = report.write_table(results_path, os.path.join(output_dir, "table.md"))
  made = plots.plot_results(results_path, output_dir)
  made += analysis.plot_learned_positions(results_path, output_dir)
  return {"results": results_path, "table": table, "plots": made}


def prepare_data(runs: Sequence[Run], task: str, overrides: dict[str, Any] | None) -> None:
  """Builds (or opens) the TFDS dataset and the tokenizer of every run's task, once each."""
  for run in runs:
    pipeline.get_task(tables.run_config(run.row, run.seed, task, overrides).task)


def _duration(seconds: float) -> str:
  """"1 h 02 min", "12 min", "40 s"."""
  if seconds >= 3600:
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"
  return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"


def _print_finished(result: dict[str, Any], done: int, total: int, started: float) -> None:
  """One line for a finished run: its first test split's BLEU, its wall time, and the time the
  table's remaining runs will take at the pace since `started` (time.monotonic)."""
  split = EVAL_SPLITS[result["config"]["task"]["name"]][0]
  left = (time.monotonic() - started) / done * (total - done)
  eta = f"; ETA {_duration(left)} for the {total - done} left" if done < total else ""
  print(f"relpos: run {done} of {total} finished: {os.path.basename(result['workdir'])} "
        f"({split} BLEU {result['scores'][split]['bleu']:.1f}, {result['wall_time_s']:.0f} s"
        f"{eta})", flush=True)


def _run_in_process(runs: Sequence[Run], *, task: str, overrides: dict[str, Any] | None,
                    output_dir: str) -> bool:
  """Runs `runs` one after another in this process; returns whether one was preempted."""
  started = time.monotonic()
  for done, run in enumerate(runs, 1):
    print(f"relpos: training and evaluating {run.workdir}", flush=True)
    result = run_one(run.table, run.row, run.seed, task, run.workdir, overrides)
    if result is None:
      logging.warning("Preempted during %s: its checkpoint is saved; rerun the same command "
                      "to resume.", run.workdir)
      return True
    _print_finished(result, done, len(runs), started)
    write_outputs(output_dir)
  return False


def child_command(run: Run, task: str, overrides: dict[str, Any] | None) -> list[str]:
  """The command that trains and evaluates `run` in a process of its own."""
  return [sys.executable, "-m", "relpos.experiments.run_one", f"--table={run.table}",
          f"--row={run.row}", f"--seed={run.seed}", f"--task={task}", f"--workdir={run.workdir}",
          *(f"--import={spec}" for spec in user_modules.imported()),
          *(f"--set={tables.format_override(k, v)}" for k, v in (overrides or {}).items())]


def _run_children(runs: Sequence[Run], *, task: str, overrides: dict[str, Any] | None,
                  output_dir: str, parallel: int) -> tuple[list[Run], bool]:
  """Runs `runs` as child processes (`children.run_all`), up to `parallel` at once;
  results.json is rebuilt after each finished one. A child that fails is reported with its
  log, and the others go on.

  Returns:
    (the runs whose process ended without a result, whether SIGINT or SIGTERM stopped them).
  """
  failed, started = [], time.monotonic()

  def ended(run: Run, returncode: int, done: int) -> None:
    if os.path.exists(run.result):
      _print_finished(read_result(run.result), done, len(runs), started)
      write_outputs(output_dir)
    else:
      failed.append(run)
      print(f"relpos: run {done} of {len(runs)} failed: {run.name} "
            f"({children.failure(returncode)}); log: {run.log}", flush=True)

  stopped = children.run_all(runs, command=lambda run: child_command(run, task, overrides),
                             env=children.environment(parallel, ROOT), parallel=parallel,
                             ended=ended)
  return failed, stopped


def _differences_from_request(run: Run, requested: ml_collections.ConfigDict) -> list[tuple]:
  """`config_validation.result_differences` between a finished run's config and `requested`
  (validated)."""
  saved = ml_collections.ConfigDict(read_result(run.result)["config"])
  try:
    config_validation.validate(saved)
  except ValueError as e:
    raise ValueError(f"{run.result}: {e}") from None
  return config_validation.result_differences(saved, requested)


def _move_aside(run: Run) -> str:
  """Renames a run's workdir to `<workdir>.replaced-<UTC time>` (kept, never deleted)."""
  aside = f"{run.workdir}{REPLACED_MARK}{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
  os.rename(run.workdir, aside)
  return aside


def _check_one_task(output_dir: str, task: str) -> None:
  """Refuses an output folder that holds runs of another task (a table has one task).

  Raises:
    ValueError: naming the folder, the other task and one of its runs.
  """
  runs_dir = os.path.join(output_dir, "runs")
  for name in sorted(os.listdir(runs_dir)) if os.path.isdir(runs_dir) else []:
    try:
      run = read_result(os.path.join(runs_dir, name, RESULT_FILE))
    except (OSError, ValueError):  # unfinished, or reported where the table reads it
      continue
    if run["task"] != task:
      raise ValueError(f"{output_dir} holds runs of task {run['task']!r} ({run['workdir']}), "
                       f"not {task!r}: a table has one task; pass another --output_dir.")


def pending_runs(runs: Sequence[Run], *, task: str, overrides: dict[str, Any] | None,
                 retrain_changed: bool) -> list[Run]:
  """The runs of `runs` to train: the unfinished ones, and the finished ones whose config
  differs from the request (with `retrain_changed`: moved aside first).

  Raises:
    ValueError: (not `retrain_changed`) a finished run whose config differs from the request
      in a field that changes its result, naming the run, the field and both values.
  """
  pending = []
  for run in runs:
    if not os.path.exists(run.result):
      pending.append(run)
      continue
    requested = tables.run_config(run.row, run.seed, task, overrides)
    config_validation.validate(requested)
    differences = _differences_from_request(run, requested)
    if not differences:
      print(f"relpos: {run.workdir} is finished; skipping it.", flush=True)
      continue
    field, saved, asked = differences[0]
    more = f" (and {len(differences) - 1} more fields)" if len(differences) > 1 else ""
    if not retrain_changed:
      raise ValueError(f"{run.result} was made with {field}={saved!r}, not the {asked!r} asked"
                       f"{more}: pass --retrain_changed to train it again (its folder is "
                       "kept aside), or use another --output_dir.")
    print(f"relpos: {run.workdir} was made with {field}={saved!r}, not {asked!r}{more}; moved "
          f"it to {_move_aside(run)} to train it again.", flush=True)
    pending.append(run)
  return pending


def run_table(table: str, *, task: str, seeds: Sequence[int], output_dir: str,
              rows: Sequence[str] | None = None, overrides: dict[str, Any] | None = None,
              parallel: int = 1, order: str = "rows",
              retrain_changed: bool = False) -> dict[str, Any]:
  """Trains and evaluates every (row, seed) of a table not finished yet in `output_dir`.

  Args:
    table: a name of `tables.TABLES`.
    task: one of tables.TASKS (its base config a file of configs/).
    seeds: the seeds to run each row with.
    output_dir: where runs, results.json, table.md and plots go (resumable).
    rows: a subset of the table's rows (default all).
    overrides: dotted config fields to set on every run, e.g. {"train.num_steps": 100}.
    parallel: how many runs at once; above 1 each is a child process (module docstring).
    order: one of ORDERS: "rows" (a row's seeds one after another) or "seeds" (every row
      with one seed before the next seed).
    retrain_changed: train again (after moving them aside) the finished runs whose config
      differs from the request in a field that changes a result; without it such a run stops
      the table before any work.

  Returns:
    write_outputs()'s paths and the table markdown, "preempted" (whether SIGTERM, or with
    `parallel` > 1 SIGINT, stopped the table) and "failed" (the logs of the runs whose child
    process ended without a result).

  Raises:
    ValueError: for an unknown table, row or order, an invalid override, no seeds, `parallel`
      < 1, an output folder holding runs of another task or a finished run made with another
      config (see `pending_runs`).
    locks.WorkdirInUseError: another table runs in `output_dir`.
  """
  if table not in tables.TABLES:
    raise ValueError(f"unknown table {table!r}; allowed: {', '.join(tables.TABLES)}.")
  if not seeds:
    raise ValueError("no seeds to run: --seeds must be at least 1.")
  if parallel < 1:
    raise ValueError(f"parallel={parallel}: must be at least 1.")
  if order not in ORDERS:
    raise ValueError(f"order={order!r}: allowed: {', '.join(ORDERS)}.")
  rows = list(rows or tables.TABLES[table])
  for row in rows:
    if not tables.row_in_table(row, table):
      any_k = " or any k=<int>" if table == "k_sweep" else ""
      raise ValueError(f"row {row!r} is not in table {table!r}; allowed: "
                       f"{', '.join(tables.TABLES[table])}{any_k}.")
  for row in rows:  # every config valid before any work
    config_validation.validate(tables.run_config(row, seeds[0], task, overrides))
  if os.path.exists(output_dir) and not os.path.isdir(output_dir):
    raise ValueError(f"--output_dir {output_dir} exists and is not a folder.")
  os.makedirs(output_dir, exist_ok=True)
  with locks.hold(output_dir, lock_file=TABLE_LOCK_FILE, what="output folder",
                  busy="another table runs there; wait for it to end (or stop it), or pass "
                       "another --output_dir"):
    _check_one_task(output_dir, task)
    runs = table_runs(table, task, rows, seeds, output_dir, order)
    pending = pending_runs(runs, task=task, overrides=overrides,
                           retrain_changed=retrain_changed)
    prepare_data(pending, task, overrides)  # once, before any run starts
    if parallel == 1:
      failed = []
      preempted = _run_in_process(pending, task=task, overrides=overrides,
                                  output_dir=output_dir)
    else:
      failed, preempted = _run_children(pending, task=task, overrides=overrides,
                                        output_dir=output_dir, parallel=parallel)
    return {**write_outputs(output_dir), "preempted": preempted,
            "failed": [run.log for run in failed]}
