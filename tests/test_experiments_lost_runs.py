"""Tests for relpos.experiments.lost_runs: the runs in flight published beside a table's
results, the losses a restart records from them, and their place in results.json (a real table
lost in flight and trained again: test_experiments_runner.py; --status writing the file:
test_experiments_status.py)."""

import json
import re
import os

import pytest

from relpos.experiments import lost_runs

REL_KV = "synthetic-ablation-rel_kv-seed0"
ABS = "synthetic-ablation-abs-seed0"


def _folders(tmp_path):
  """(published folder, runs folder, output folder) under `tmp_path`."""
  output_dir = str(tmp_path / "out")
  return str(tmp_path / "published"), os.path.join(output_dir, "runs"), output_dir


def _in_flight(published_dir: str) -> dict:
  with open(os.path.join(published_dir, lost_runs.IN_FLIGHT_FILE), encoding="utf-8") as f:
    return json.load(f)


def test_a_run_in_flight_whose_folder_is_gone_is_recorded_lost_once(tmp_path):
  published_dir, runs_dir, output_dir = _folders(tmp_path)
  os.makedirs(os.path.join(runs_dir, ABS))
  lost_runs.write_in_flight(published_dir, output_dir, [
      {"run": REL_KV, "step": 5198, "checkpoint": 5100, "num_steps": 8000},
      {"run": ABS, "step": 40, "checkpoint": None, "num_steps": 8000},
  ], {REL_KV, ABS})
  written_at = _in_flight(published_dir)["written_at"]

  found = lost_runs.record_losses(published_dir, runs_dir, output_dir)
  assert found == [
      f"{REL_KV}: its folder is missing; it had reached step 5,198 of 8,000 (checkpoint 5,100) "
      f"as of {written_at[:16].replace('T', ' ')} UTC "
      f"({os.path.join(published_dir, lost_runs.IN_FLIGHT_FILE)}), and trains again from step 0."
  ]  # abs's folder is there: it resumes, nothing lost
  [loss] = lost_runs.read_losses(output_dir)[REL_KV]
  assert {k: loss[k] for k in ("step", "checkpoint", "num_steps", "as_of")
         } == {"step": 5198, "checkpoint": 5100, "num_steps": 8000, "as_of": written_at}
  assert loss["found_at"] >= written_at
  assert list(lost_runs.read_losses(output_dir)) == [REL_KV]

  # A second restore before the run's folder exists again tells and records nothing new.
  assert lost_runs.record_losses(published_dir, runs_dir, output_dir) == []
  assert lost_runs.read_losses(output_dir)[REL_KV] == [loss]

  # The restart made the folder (training from step 0): found again, nothing more is recorded.
  os.makedirs(os.path.join(runs_dir, REL_KV))
  assert lost_runs.record_losses(published_dir, runs_dir, output_dir) == []
  assert lost_runs.read_losses(output_dir)[REL_KV] == [loss]


def test_a_look_at_a_machine_that_lost_the_runs_keeps_them_in_flight(tmp_path):
  """--status on a fresh machine, before the restart that records the loss, lists no run in
  flight there (and settles none: no folder): the runs the file listed stay as they were."""
  published_dir, runs_dir, output_dir = _folders(tmp_path)
  lost_runs.write_in_flight(published_dir, output_dir,
                            [{"run": REL_KV, "step": 300, "checkpoint": 300, "num_steps": 800}],
                            {REL_KV})
  first = _in_flight(published_dir)
  lost_runs.write_in_flight(published_dir, str(tmp_path / "fresh"), [], set())
  second = _in_flight(published_dir)
  assert second["runs"] == [{**first["runs"][0], "as_of": first["written_at"]}]
  lost_runs.record_losses(published_dir, runs_dir, output_dir)
  [loss] = lost_runs.read_losses(output_dir)[REL_KV]
  assert loss["as_of"] == first["written_at"]  # when its step was read, not the later look

  # Once its folder is back (trained again), the next write lists it as it is now, with the
  # loss on record beside it, so a second loss keeps the first.
  os.makedirs(os.path.join(runs_dir, REL_KV))
  lost_runs.write_in_flight(published_dir, output_dir,
                            [{"run": REL_KV, "step": 20, "checkpoint": None, "num_steps": 800}],
                            {REL_KV})
  assert _in_flight(published_dir)["runs"] == [{
      "run": REL_KV, "step": 20, "checkpoint": None, "num_steps": 800, "lost": [loss]
  }]
  # A look at another row only keeps this one listed.
  lost_runs.write_in_flight(published_dir, output_dir,
                            [{"run": ABS, "step": 4, "checkpoint": None, "num_steps": 800}], {ABS})
  assert [run["run"] for run in _in_flight(published_dir)["runs"]] == [ABS, REL_KV]
  again = str(tmp_path / "lost again")
  lost_runs.record_losses(published_dir, os.path.join(again, "runs"), again)
  first_loss, second_loss = lost_runs.read_losses(again)[REL_KV]
  assert first_loss == loss and second_loss["step"] == 20


def test_nothing_in_flight_writes_no_file_but_empties_one_there(tmp_path):
  published_dir, runs_dir, output_dir = _folders(tmp_path)
  assert lost_runs.write_in_flight(published_dir, output_dir, [], set()) is None
  assert not os.path.exists(published_dir)
  lost_runs.write_in_flight(published_dir, output_dir,
                            [{"run": REL_KV, "step": 3, "checkpoint": 2, "num_steps": 8}], {REL_KV})
  path = lost_runs.write_in_flight(published_dir, output_dir, [], {REL_KV})  # it finished
  assert _in_flight(published_dir)["runs"] == [] and path.endswith(lost_runs.IN_FLIGHT_FILE)


def test_a_run_that_had_not_trained_is_not_lost(tmp_path):
  published_dir, runs_dir, output_dir = _folders(tmp_path)
  lost_runs.write_in_flight(published_dir, output_dir,
                            [{"run": REL_KV, "step": None, "checkpoint": None, "num_steps": 8}],
                            {REL_KV})
  assert lost_runs.record_losses(published_dir, runs_dir, output_dir) == []
  assert lost_runs.read_losses(output_dir) == {}
  assert not os.path.exists(os.path.join(output_dir, lost_runs.LOSSES_FILE))


def test_attach_adds_each_runs_losses_to_those_its_result_holds(tmp_path):
  _, _, output_dir = _folders(tmp_path)
  os.makedirs(output_dir)
  earlier = {"step": 10, "checkpoint": 10, "num_steps": 80, "as_of": "2026-11-01T00:00:00+00:00"}
  later = {"step": 50, "checkpoint": 40, "num_steps": 80, "as_of": "2026-11-02T00:00:00+00:00"}
  with open(os.path.join(output_dir, lost_runs.LOSSES_FILE), "w", encoding="utf-8") as f:
    json.dump({REL_KV: [later, earlier]}, f)
  runs = [{"workdir": f"runs/{REL_KV}", "lost": [earlier]}, {"workdir": f"runs/{ABS}"}]
  lost_runs.attach(runs, output_dir)
  assert runs == [{"workdir": f"runs/{REL_KV}", "lost": [earlier, later]},
                  {"workdir": f"runs/{ABS}"}]
  assert lost_runs.describe(later) == "step 50 of 80 (checkpoint 40) as of 2026-11-02 00:00 UTC"
  assert lost_runs.describe({**earlier, "checkpoint": None, "num_steps": None
                            }) == ("step 10 (no checkpoint) as of 2026-11-01 00:00 UTC")


@pytest.mark.parametrize("text, detail", [
    ("[1, 2]", "is not a table's runs in flight (not a JSON object)"),
    ('{"runs": 3}', "is not a table's runs in flight (no 'runs' list or no 'written_at')"),
    ("{", "is not valid JSON"),
])
def test_a_damaged_in_flight_file_is_named_in_one_line(tmp_path, text, detail):
  published_dir, runs_dir, output_dir = _folders(tmp_path)
  os.makedirs(published_dir)
  path = os.path.join(published_dir, lost_runs.IN_FLIGHT_FILE)
  with open(path, "w", encoding="utf-8") as f:
    f.write(text)
  with pytest.raises(ValueError, match=f"^{re.escape(path + ' ' + detail)}"):
    lost_runs.record_losses(published_dir, runs_dir, output_dir)
