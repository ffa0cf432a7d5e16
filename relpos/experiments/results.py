"""A table's results: each run's result.json (written last: the run is finished), and
results.json (every finished run), from which table.md and the plots are made; their published
copy (`publish`: with the runs' test translations, e.g. into docs/results/), and the finished
runs written back from it into an output folder that was lost (`restore_published`).

A result records its run's workdir relative to the table's folder (`runs/<name>`); results
written before that record it as an absolute path. `workdir_of` reads either.
"""
import os
import shutil
from typing import Any

import flax
import jax
from absl import logging

from relpos import config_changes
from relpos import json_files
from relpos import run_config as config_lib
from relpos import metrics_writer
from relpos import workdir_files
from relpos.experiments import failed_runs
from relpos.experiments import lost_runs
from relpos.experiments import paired
from relpos.experiments import plots
from relpos.experiments import plots_learned
from relpos.experiments import report
from relpos.experiments import run_names
from relpos.experiments import tables

RESULT_FILE = "result.json"
RESULTS_FILE = "results.json"
# The folder of a table's runs, in its output folder.
RUNS_DIR = "runs"
# A run trained again with --retrain_changed is first renamed <workdir><REPLACED_MARK><time>.
REPLACED_MARK = ".replaced-"


def environment() -> dict[str, Any]:
  """The software and devices results are made with: jax and flax versions, device kind
  (e.g. "cpu", "NVIDIA H200") and count, and the host's CPU (`metrics_writer.host_cpu`)."""
  devices = jax.devices()
  return {
      "jax_version": jax.__version__, "flax_version": flax.__version__,
      "device_kind": devices[0].device_kind, "device_count": len(devices),
      "host_cpu": metrics_writer.host_cpu()
  }


def relative_workdir(workdir: str) -> str:
  """How a result records `workdir` (`<output_dir>/runs/<name>`): relative to the table's
  folder, `runs/<name>`, so that a table's files mean the same on every machine."""
  workdir = os.path.abspath(workdir)
  return os.path.relpath(workdir, os.path.dirname(os.path.dirname(workdir)))


def workdir_of(result: dict[str, Any], output_dir: str) -> str:
  """The workdir of a result of the table in `output_dir`: its relative `workdir` under
  `output_dir`, or the absolute path that older results hold."""
  return os.path.join(output_dir, result["workdir"])  # an absolute path stays as it is


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
  missing = ([f for f in RESULT_FIELDS if f not in result]
             if isinstance(result, dict) else list(RESULT_FIELDS))
  if missing or not isinstance(result["scores"], dict):
    raise ValueError(f"{path} is not a run's result (no {(missing or ['scores'])[0]!r}): "
                     "delete it to evaluate that run again.")
  return result


def run_folders(output_dir: str) -> list[str]:
  """The run folders under `output_dir/runs` by name, not those moved aside (REPLACED_MARK)."""
  runs_dir = os.path.join(output_dir, RUNS_DIR)
  names = sorted(os.listdir(runs_dir)) if os.path.isdir(runs_dir) else []
  return [os.path.join(runs_dir, name) for name in names if REPLACED_MARK not in name]


def collect(output_dir: str) -> list[dict[str, Any]]:
  """Every finished run under `output_dir/runs` (not those moved aside), in table and row
  order; a result.json that cannot be read is left out with a warning naming it (the table
  goes on).

  Raises:
    ValueError: naming both folders, when two hold a result of the same run (task, table,
      row, seed): counted twice, one seed would read as two.
  """
  runs_dir = os.path.join(output_dir, RUNS_DIR)
  runs = []
  for workdir in run_folders(output_dir):
    path = os.path.join(workdir, RESULT_FILE)
    if os.path.exists(path):
      try:
        runs.append(read_result(path))
      except ValueError as e:
        logging.warning("Left out of the table: %s", e)
  folder_of = {}  # (task, table, row, seed) -> the folder that holds its result
  for run in runs:
    key, folder = (run["task"], run["table"], run["row"], run["seed"]), run["workdir"]
    if key in folder_of:
      raise ValueError(f"{folder_of[key]} and {folder} both hold a result of row {run['row']} "
                       f"seed {run['seed']} ({run['table']} on {run['task']}): move one out of "
                       f"{runs_dir}.")
    folder_of[key] = folder
  order = {}
  for key in ((t, r) for t in tables.TABLES for r in (*tables.TABLES[t], *tables.ROWS)):
    order.setdefault(key, len(order))
  # Rows outside the tables' lists (a k off the paper's grid, a variant of one's own) after
  # them: a k by its number (k=12 after k=3), the others by name; each row's seeds in order.
  return sorted(
      runs, key=lambda r: (order.get(
          (r["table"], r["row"]), len(order)), r.get("k") or 0, r["row"], r["seed"]))


def collect_failed(output_dir: str) -> list[dict[str, Any]]:
  """[{"run": its folder's name, **its failure (`failed_runs`)}] of each run under
  `output_dir/runs` (not those moved aside) that failed and has not finished since, by name."""
  failed = []
  for workdir in run_folders(output_dir):
    failure = failed_runs.read(workdir)
    if failure is not None and not os.path.exists(os.path.join(workdir, RESULT_FILE)):
      failed.append({"run": os.path.basename(workdir), **failure})
  return failed


def write_outputs(output_dir: str, publish_to: str | None = None) -> dict[str, Any]:
  """results.json from the finished runs (with `paired.annotate`'s comparisons) and the failed
  ones (`collect_failed`), then table.md
  and the plots from it; with `publish_to`, then a copy of them and of the runs' test
  translations there (`publish`)."""
  results_path = os.path.join(output_dir, RESULTS_FILE)
  runs = collect(output_dir)
  lost_runs.attach(runs, output_dir)
  paired.annotate(runs, [workdir_of(run, output_dir) for run in runs])
  json_files.write_json(
      results_path, {
          "schema_version": report.RESULTS_SCHEMA_VERSION, "written_at": json_files.utc_now(),
          **environment(), "runs": runs, "failed": collect_failed(output_dir)
      }, indent=1)
  table = report.write_table(results_path, os.path.join(output_dir, "table.md"))
  made = plots.plot_results(results_path, output_dir)
  made += plots_learned.plot_learned_positions(results_path, output_dir)
  outputs = {"results": results_path, "table": table, "plots": made}
  return {**outputs, "published": publish(output_dir, publish_to)} if publish_to else outputs


# In a published table's folder: each finished run's translations of its test splits, under
# TRANSLATIONS_DIR/<run>/ (the .txt files of the run's eval/ folder, names unchanged; their
# .json records hold absolute paths and scores results.json has, so they stay behind).
TRANSLATIONS_DIR = "translations"


def translations_of_test_splits(result: dict[str, Any], output_dir: str) -> list[str]:
  """The paths of the translation files in the eval/ folder of `result`'s run (in the table in
  `output_dir`) of the splits it scored other than validation (`evaluation_files.output_name`:
  `<split>.<checkpoint>.step<N>.beam<B>.alpha<A>.txt`, and `.sources.txt` beside it for a
  split stored out of its files' order), by name."""
  eval_dir = os.path.join(workdir_of(result, output_dir), workdir_files.EVAL_DIR)
  names = sorted(os.listdir(eval_dir)) if os.path.isdir(eval_dir) else []
  splits = [split for split in result["scores"] if split != "validation"]
  return [
      os.path.join(eval_dir, n) for n in names if n.endswith(".txt") and n.split(".")[0] in splits
  ]


def publish(output_dir: str, destination: str) -> list[str]:
  """Copies a table's results.json, table.md and plots from `output_dir` into `destination`
  (e.g. docs/results/<table>/, created if missing), and each finished run's test translations
  (`translations_of_test_splits`) into `destination`/TRANSLATIONS_DIR/<run>/, each file whole
  or not at all, so that what a finished run measured outlives its output folder
  (`restore_published` reads it back). The translations let the published runs be compared by
  paired bootstrap (`sacrebleu ... --paired-bs`) without their checkpoints.

  Returns:
    The files written, results.json first.
  """
  names = [RESULTS_FILE, "table.md"] + sorted(
      n for n in os.listdir(output_dir) if n.endswith(".png"))
  copies = [(os.path.join(output_dir, n), os.path.join(destination, n)) for n in names]
  for result in collect(output_dir):
    run_copy = os.path.join(destination, TRANSLATIONS_DIR, os.path.basename(result["workdir"]))
    copies += [(path, os.path.join(run_copy, os.path.basename(path)))
               for path in translations_of_test_splits(result, output_dir)]
  for source, path in copies:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    json_files.copy_file(source, path)
  return [path for _, path in copies]


def read_published(path: str, flag: str, *, table: str, task: str) -> list[dict[str, Any]]:
  """The runs of a published results.json (`publish`), checked to be a table's and to hold
  runs of `table` on `task` (when it holds any).

  Raises:
    ValueError: naming `flag` and `path`: unreadable, not a table's results.json, or runs of
      other tables or tasks only.
  """
  try:
    published_runs = report.load_runs(path)
  except OSError as e:
    raise ValueError(f"{flag} {path}: {e.strerror}.") from None
  except (ValueError, KeyError, TypeError, AttributeError) as e:
    detail = str(e) if isinstance(e, ValueError) else "no 'runs' list"
    raise ValueError(f"{flag} {path} is not a table's results.json ({detail}).") from None
  if not isinstance(published_runs, list):
    raise ValueError(f"{flag} {path} is not a table's results.json (no 'runs' list).")
  for result in published_runs:
    if not isinstance(result, dict) or any(field not in result for field in RESULT_FIELDS):
      raise ValueError(f"{flag} {path} holds a run without {', '.join(RESULT_FIELDS)}: not a "
                       "table's results.json.")
  published_tables = {(r["table"], r["task"]) for r in published_runs}
  if published_runs and (table, task) not in published_tables:
    given = ", ".join(f"{t} on {k}" for t, k in sorted(published_tables))
    raise ValueError(f"{flag} {path} holds runs of table {given}, not of table {table} on "
                     f"{task}.")
  return published_runs


def check_writable(destination: str) -> None:
  """Creates `destination` (a `--publish_to` folder) if missing.

  Raises:
    ValueError: naming it, when it cannot be made or written.
  """
  try:
    os.makedirs(destination, exist_ok=True)
    if not os.access(destination, os.W_OK):
      raise PermissionError(f"{destination} is not writable")
  except OSError as e:
    raise ValueError(f"--publish_to {destination}: cannot write there ({e}).") from None


def check_publish_keeps(destination: str, output_dir: str, *, table: str, task: str) -> None:
  """Refuses, before any work, a `--publish_to` folder whose results.json publishing this
  table would replace with less: runs of another table or task, or finished runs whose
  folders `output_dir` lacks (lost with an earlier output folder: `--restore_from` that
  results.json brings them back), or finished runs that `output_dir` holds made otherwise (in
  a field that changes a result: another experiment). A run whose folder exists, resuming or
  retrained, is this table's to publish.

  Raises:
    ValueError: naming the folder and what publishing would lose.
  """
  path = os.path.join(destination, RESULTS_FILE)
  if not os.path.exists(path):
    return
  published_runs = read_published(path, "--publish_to", table=table, task=task)
  runs_dir = os.path.join(output_dir, RUNS_DIR)
  lost = [
      name for name in map(run_names.run_name_of, published_runs)
      if not os.path.isdir(os.path.join(runs_dir, name))
  ]
  if lost:
    raise ValueError(f"--publish_to {destination} holds {len(lost)} finished runs that "
                     f"{output_dir} lacks ({', '.join(lost)}): publishing would drop them. Add "
                     f"--restore_from={path} to bring them back, or publish elsewhere.")
  for published_run in published_runs:
    name = run_names.run_name_of(published_run)
    local = os.path.join(runs_dir, name, RESULT_FILE)
    if os.path.exists(local) and (difference := _made_otherwise(published_run, read_result(local))):
      field, there, here = difference
      raise ValueError(f"--publish_to {destination} holds {name} made with {field}={there!r}, "
                       f"and {output_dir} one made with {here!r}: publishing would replace another "
                       "experiment's result. Publish elsewhere, or take that run out of its "
                       "results.json first.")


def _made_otherwise(published: dict[str, Any], local: dict[str, Any]) -> tuple | None:
  """The first field that changes a result whose value differs between two results of one run
  (field, published value, local value); None when none does, or when a config no longer
  validates (a variant of one's own not imported: not compared)."""
  try:
    before, after = config_lib.validate(published["config"]), config_lib.validate(local["config"])
  except ValueError:
    return None
  return next(iter(config_changes.result_differences(before, after)), None)


def repository_path(path: str) -> str:
  """`path` relative to the root of the git work tree that holds it (a published table's
  `docs/results/<table>/results.json`, the same in every clone), else as given."""
  folder = os.path.dirname(os.path.abspath(path))
  while not os.path.exists(os.path.join(folder, ".git")):
    if os.path.dirname(folder) == folder:
      return path
    folder = os.path.dirname(folder)
  return os.path.relpath(os.path.abspath(path), folder)


def restore_published(published: str, output_dir: str, *, table: str, task: str) -> list[str]:
  """Writes back the result.json of each run of `task` that `published` (a table's
  results.json, e.g. the copy under docs/results/) holds finished and whose folder `output_dir`
  lacks, so a table whose output folder was lost goes on from its published runs instead of
  training them again (and publishes them again, whichever rows it runs now; those of other
  tables that shared the folder too, as `check_publish_keeps` expects).

  A restored result is the published one plus "restored": {"from": `published` (its
  `repository_path`), "at": UTC
  time, and for a run restored before, "earlier": [its earlier {"from", "at"}, oldest first]},
  with the test translations `publish` kept beside `published` back in its eval/ folder; its
  checkpoints and metrics were never published, so it cannot be evaluated again or resumed. A
  run whose folder exists is left as it is (it resumes, or is finished, from its own files).

  Args:
    published: the results.json to restore from.
    output_dir: the table's output folder.
    table, task: the table's name and task, which `published` must hold runs of.

  Returns:
    The workdirs written, in the order of `published`.

  Raises:
    ValueError: naming `published` when it cannot be read, is not a table's results.json, or
      holds runs of other tables or tasks only.
  """
  restored = []
  for published_result in read_published(published, "--restore_from", table=table, task=task):
    workdir = os.path.join(output_dir, RUNS_DIR, run_names.run_name_of(published_result))
    if published_result["task"] != task or os.path.exists(workdir):
      continue  # (a folder, and so its results.json, may hold several tables of one task)
    result = {**published_result, "workdir": relative_workdir(workdir)}
    result["restored"] = {"from": repository_path(published), "at": json_files.utc_now()}
    if earlier := published_result.get("restored"):  # lost before: each loss stays on record
      result["restored"]["earlier"] = earlier.get(
          "earlier", []) + [{"from": earlier["from"], "at": earlier["at"]}]
    translations = os.path.join(os.path.dirname(published), TRANSLATIONS_DIR,
                                os.path.basename(published_result["workdir"]))
    # Made aside and renamed into place: a start killed midway leaves no folder that the next
    # would take for a run begun (and train again from step 0).
    making = workdir + ".restoring"
    shutil.rmtree(making, ignore_errors=True)
    eval_dir = os.path.join(making, workdir_files.EVAL_DIR)
    os.makedirs(eval_dir)
    for file_name in sorted(os.listdir(translations)) if os.path.isdir(translations) else []:
      json_files.copy_file(os.path.join(translations, file_name), os.path.join(eval_dir, file_name))
    json_files.write_json(os.path.join(making, RESULT_FILE), result, indent=1)
    os.rename(making, workdir)
    restored.append(workdir)
  return restored
