"""Runs lost in flight: a table's unfinished runs published beside its results, and, when its
output folder is later lost, a record of each run trained again from step 0.

`write_in_flight` writes IN_FLIGHT_FILE into a table's published folder (`--publish_to`, e.g.
docs/results/<table>/): each begun, unfinished run's last step and newest checkpoint, when they
were read, and the losses already on record for it. The table's command with --status writes it,
and so does a table that stops (SIGTERM) or ends; committed beside results.json, it is what
outlives the machine.

`record_losses` (run by `--restore_from`, after the finished runs are written back) reads it beside
the published results.json: each run it lists whose folder the output folder lacks is trained
again from step 0, and its loss goes into <output_dir>/LOSSES_FILE. `attach` copies each finished
run's losses into its entry of results.json ("lost"), where table.md names them and a later
`--restore_from` brings them back with the run.

A loss: {"step": the last step trained, "checkpoint": the newest checkpoint's step (None: none was
saved), "num_steps", "as_of": when IN_FLIGHT_FILE read them (UTC), "found_at": when a restart
found the folder missing}. Steps trained after IN_FLIGHT_FILE was written are not on record: the
loss is at least that.
"""
import os
from collections.abc import Collection, Sequence
from typing import Any

from relpos import json_files

IN_FLIGHT_FILE = "in_flight.json"
LOSSES_FILE = "lost_runs.json"


def _read(path: str, what: str) -> dict[str, Any]:
  """The JSON object in `path` ({} when there is no file).

  Raises:
    ValueError: naming `path` when it is not JSON or not `what`.
  """
  if not os.path.exists(path):
    return {}
  data = json_files.read_json(path)
  if not isinstance(data, dict):
    raise ValueError(f"{path} is not {what} (not a JSON object): delete it or restore it from "
                     f"git.")
  return data


def read_losses(output_dir: str) -> dict[str, list[dict[str, Any]]]:
  """{run name: its losses, oldest first} recorded in `output_dir` ({} when none).

  Raises:
    ValueError: naming LOSSES_FILE when it cannot be read.
  """
  return _read(os.path.join(output_dir, LOSSES_FILE), "a record of lost runs")


def _merged(*losses: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
  """`losses` joined, one per published progress ("as_of", "step": the same progress found
  missing twice is one loss on record), oldest first."""
  by_progress = {}
  for loss in (loss for group in losses for loss in group):
    by_progress.setdefault((loss["as_of"], loss["step"]), loss)
  return [by_progress[key] for key in sorted(by_progress, key=lambda key: key[0])]


def _published_runs(path: str) -> tuple[str | None, list[dict[str, Any]]]:
  """(written_at, runs) of the IN_FLIGHT_FILE `path` ((None, []) when there is none).

  Raises:
    ValueError: naming `path`, when it is not a table's runs in flight.
  """
  published = _read(path, "a table's runs in flight")
  runs = published.get("runs", [])
  if not isinstance(runs, list) or (runs and "written_at" not in published):
    raise ValueError(f"{path} is not a table's runs in flight (no 'runs' list or no "
                     f"'written_at'): delete it or restore it from git.")
  return published.get("written_at"), runs


def write_in_flight(destination: str, output_dir: str, in_flight: Sequence[dict[str, Any]],
                    settled: Collection[str]) -> str | None:
  """Writes IN_FLIGHT_FILE into `destination`: `in_flight` ({"run": name, "step", "checkpoint",
  "num_steps"} of each begun, unfinished run looked at) with each run's losses on record in
  `output_dir` ("lost", where it has any), and the time. The runs the file listed before stay
  listed as they were (with the time they were read) unless `settled` names them (finished, or
  looked at now in their folders): a look at a machine that lost them, before the restart that
  records them, or at some rows only, does not erase them.

  Returns:
    The file's path; None where there is nothing to write (no run in flight, no file).
  """
  path = os.path.join(destination, IN_FLIGHT_FILE)
  if not in_flight and not os.path.exists(path):
    return None
  written_at, earlier = _published_runs(path)
  losses = read_losses(output_dir)
  runs = [{**run, "lost": losses[run["run"]]} if run["run"] in losses else dict(run)
          for run in in_flight]
  runs += [
      {"as_of": run.get("as_of", written_at), **run} for run in earlier if run["run"] not in settled
  ]
  os.makedirs(destination, exist_ok=True)
  json_files.write_json(path, {"written_at": json_files.utc_now(), "runs": runs}, indent=1)
  return path


def record_losses(published_dir: str, runs_dir: str, output_dir: str) -> list[str]:
  """Records in `output_dir`'s LOSSES_FILE each run that `published_dir`'s IN_FLIGHT_FILE lists
  as having trained and whose folder `runs_dir` lacks (it will train again from step 0), with
  the losses listed for it there; run after the finished runs are written back, so a run that
  finished since is not taken for lost.

  Returns:
    One line per run newly found lost: its name, the step and checkpoint it had reached, and
    when that was read. A loss an earlier restore recorded is not told again (its folder may
    still be missing when restores come one after another).

  Raises:
    ValueError: naming the file, when IN_FLIGHT_FILE or LOSSES_FILE cannot be read.
  """
  path = os.path.join(published_dir, IN_FLIGHT_FILE)
  written_at, published = _published_runs(path)
  losses, found = read_losses(output_dir), []
  for run in published:
    name, earlier = run["run"], run.get("lost", [])
    if run.get("step") and not os.path.exists(os.path.join(runs_dir, name)):
      loss = {key: run.get(key) for key in ("step", "checkpoint", "num_steps")}
      loss |= {"as_of": run.get("as_of", written_at), "found_at": json_files.utc_now()}
      recorded = {(known["as_of"], known["step"]) for known in losses.get(name, [])}
      if (loss["as_of"], loss["step"]) not in recorded:  # not found by an earlier restore
        earlier = [*earlier, loss]
        found.append(f"{name}: its folder is missing; it had reached {describe(loss)} "
                     f"({path}), and trains again from step 0.")
    if earlier:
      losses[name] = _merged(losses.get(name, []), earlier)
  if losses:
    os.makedirs(output_dir, exist_ok=True)
    json_files.write_json(os.path.join(output_dir, LOSSES_FILE), losses, indent=1)
  return found


def attach(runs: Sequence[dict[str, Any]], output_dir: str) -> None:
  """Adds to each finished run of `runs` (a results.json's entries, changed in place) the losses
  `output_dir` records for it, beside those its result already holds ("lost")."""
  losses = read_losses(output_dir)
  for run in runs:
    lost = _merged(run.get("lost", []), losses.get(os.path.basename(run["workdir"]), []))
    if lost:
      run["lost"] = lost


def describe(loss: dict[str, Any]) -> str:
  """ "step 5,198 of 8,000 (checkpoint 5,100) as of 2026-11-28 07:18 UTC" """
  of = f" of {loss['num_steps']:,}" if loss.get("num_steps") else ""
  checkpoint = loss.get("checkpoint")
  saved = f"checkpoint {checkpoint:,}" if checkpoint is not None else "no checkpoint"
  as_of = loss["as_of"][:16].replace("T", " ")
  return f"step {loss['step']:,}{of} ({saved}) as of {as_of} UTC"
