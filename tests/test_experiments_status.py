"""Tests for relpos.experiments.status: a table's state read from its folder
(folders made here as a run leaves them; a real finished table's status is checked in
test_experiments_runner.py), and the `--status` command."""

import json
import os
import socket
import subprocess
import sys

import pytest

from relpos import json_files
from relpos import locks
from relpos import metrics_writer
from relpos import workdir_files
from relpos.experiments import lost_runs
from relpos.experiments import runner
from relpos.experiments import single_run
from relpos.experiments import status
from relpos.experiments import tables

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run_folder(workdir: str, *, trained: int, validated: dict[int, float], saved: list[int],
                num_steps: int = 8) -> None:
  """A run's folder as training leaves it: config.json, metrics.jsonl with a train record every
  2 steps up to `trained` and validations {step: BLEU}, checkpoint folders `saved` and one save
  in flight."""
  os.makedirs(os.path.join(workdir, workdir_files.CHECKPOINT_DIR))
  json_files.write_json(os.path.join(workdir, workdir_files.CONFIG_FILE),
                        {"train": {"num_steps": num_steps}})
  with open(os.path.join(workdir, workdir_files.METRICS_FILE), "w", encoding="utf-8") as f:
    for step in range(2, trained + 1, 2):
      f.write(json.dumps({"step": step, "split": "train", "steps_per_second": 0.5}) + "\n")
      if step in validated:
        f.write(json.dumps({"step": step, "split": "validation", "bleu": validated[step]}) + "\n")
    f.write('{"step": 99, "split": "tr')  # a line cut by a kill: not a record
  for step in saved:
    os.makedirs(os.path.join(workdir, workdir_files.CHECKPOINT_DIR, str(step)))
  os.makedirs(
      os.path.join(workdir, workdir_files.CHECKPOINT_DIR, f"{trained}.orbax-checkpoint-tmp-1"))


def _finish(run: runner.Run, test_bleu: float) -> None:
  json_files.write_json(
      run.result, {
          "table": run.table, "row": run.row, "seed": run.seed, "task": "synthetic", "config": {},
          "workdir": f"runs/{run.name}", "wall_time_s": 7200.0, "scores": {
              "validation": {"bleu": 61.5, "step": 4}, "test": {"bleu": test_bleu},
              "test_long": {"bleu": 20.0}
          }
      })


@pytest.fixture
def table(tmp_path):
  """A table of rows abs, rel_kv, none with seeds 0 and 1 in `tmp_path`/out: abs seed 0
  finished, rel_kv seed 0 stopped at step 6, none seed 0 trained to step 4, the rest not
  started; a run of another row beside them and one moved aside. Returns (output folder, its
  runs in the table's order)."""
  output_dir = str(tmp_path / "out")
  runs = runner.table_runs("ablation", "synthetic", ["abs", "rel_kv", "none"], [0, 1], output_dir,
                           order="seeds")
  abs0, rel_kv0, none0 = runs[:3]
  _run_folder(abs0.workdir, trained=8, validated={4: 61.5, 8: 61.25}, saved=[4, 8])
  _finish(abs0, 58.04)
  _run_folder(rel_kv0.workdir, trained=6, validated={2: 43.0, 4: 41.5, 6: 43.0}, saved=[2, 4, 6])
  _run_folder(none0.workdir, trained=4, validated={}, saved=[2])
  os.makedirs(os.path.join(output_dir, "runs", "synthetic-ablation-rope-seed0"))
  mine = os.path.join(output_dir, "runs", "synthetic-ablation-mine-seed0")  # a user's variant
  os.makedirs(mine)
  json_files.write_json(os.path.join(mine, workdir_files.IMPORTS_FILE), ["/x/mine.py"])
  os.makedirs(os.path.join(output_dir, "runs", "synthetic-ablation-t5-seed0.replaced-20261124"))
  return output_dir, runs


def test_each_run_is_finished_stopped_running_or_not_started(table):
  output_dir, runs = table
  abs0, rel_kv0, none0, abs1 = runs[:4]
  with locks.hold(none0.workdir, lock_file=single_run.LOCK_FILE):
    running = status.run_status(none0)
  assert status.run_status(abs0) == status.RunStatus(abs0.name, "finished", step=8, num_steps=8,
                                                     checkpoint=8, validation=(4, 61.5),
                                                     test=("test", 58.04),
                                                     updated=os.path.getmtime(abs0.result),
                                                     steps_per_second=0.5, wall_time_s=7200.0)
  stopped = status.run_status(rel_kv0)
  assert (stopped.state, stopped.step, stopped.checkpoint, stopped.validation,
          stopped.test) == ("stopped", 6, 6, (6, 43.0), None)  # the best, the newest of a tie
  assert (running.state, running.step, running.checkpoint, running.validation) == ("running", 4, 2,
                                                                                   None)
  assert status.run_status(abs1) == status.RunStatus(abs1.name, "not started")
  assert status.run_status(none0).state == "stopped"  # the lock released


def test_report_says_whether_the_table_runs_and_lists_every_run_in_order(table, monkeypatch):
  output_dir, runs = table
  monkeypatch.setattr(metrics_writer, "load_average", lambda: 2.5)  # 2 cores + 1 at most: alone
  monkeypatch.setattr(metrics_writer, "usable_cpus", lambda: 2)
  with locks.hold(output_dir, lock_file=runner.TABLE_LOCK_FILE):
    with locks.hold(runs[2].workdir):  # none seed 0 trains
      text = status.report("ablation", "synthetic", runs, output_dir)
  lines = text.splitlines()
  assert lines[0] == (f"Table ablation on synthetic in {output_dir}: running (process "
                      f"{os.getpid()} on host {socket.gethostname()}, started "
                      f"{lines[0].split('started ')[1]}")
  assert lines[1] == "1 of 6 runs finished, 1 running, 1 stopped, 3 not started."
  assert lines[3].split() == [
      "run", "state", "step", "checkpoint", "best", "validation", "BLEU", "test", "BLEU", "updated",
      "training", "left"
  ]
  cells = [line.split()[:6] for line in lines[4:10]]
  assert cells == [
      ["synthetic-ablation-abs-seed0", "finished", "8/8", "8", "61.5", "at"],
      ["synthetic-ablation-rel_kv-seed0", "stopped", "6/8", "6", "43.0", "at"],
      ["synthetic-ablation-none-seed0", "running", "4/8", "2", "-", "-"],
      ["synthetic-ablation-abs-seed1", "not", "started", "-", "-", "-"],
      ["synthetic-ablation-rel_kv-seed1", "not", "started", "-", "-", "-"],
      ["synthetic-ablation-none-seed1", "not", "started", "-", "-", "-"],
  ]
  assert "58.0" in lines[4]
  assert lines[6].endswith("UTC  8 s")  # 4 steps left at 0.5 steps/s
  assert lines[11].startswith("The finished runs took 2 h 00 min each")
  # 2 h for each: 1/4 of rel_kv seed 0 (6 of 8 steps trained), 1/2 of none seed 0, 3 not started
  assert lines[11].endswith(" The 5 runs not finished need about 7 h 30 min more (the finished "
                            "runs' median, 2 h 00 min a run, less the steps each has trained).")
  assert lines[-1] == (f"Also in {output_dir}/runs, not in these rows and seeds: "
                       "synthetic-ablation-mine-seed0 (made with --import=/x/mine.py: add it to "
                       "count its row), synthetic-ablation-rope-seed0.")
  assert status.report(
      "ablation", "synthetic", runs,
      output_dir).startswith(f"Table ablation on synthetic in {output_dir}: not running.\n")


def test_report_warns_when_a_run_is_timed_on_a_loaded_machine(table, monkeypatch):
  output_dir, runs = table
  monkeypatch.setattr(metrics_writer, "usable_cpus", lambda: 2)
  monkeypatch.setattr(metrics_writer, "load_average", lambda: 4.25)
  warning = "This machine's load average is 4.2 on 2 cores: a run here is timed beside other work"
  with locks.hold(runs[2].workdir):  # none seed 0 trains
    assert warning in status.report("ablation", "synthetic", runs, output_dir)
  assert warning not in status.report("ablation", "synthetic", runs, output_dir)  # none running


def test_status_command_prints_the_report_and_a_wrong_row_in_one_line(table):
  output_dir, _ = table
  command = [
      sys.executable, "-m", "relpos.experiments.run", "--table=ablation", "--task=synthetic",
      "--rows=abs,rel_kv,none", "--seeds=2", "--order=seeds", f"--output_dir={output_dir}",
      "--status"
  ]
  done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
  assert done.stdout.startswith(f"Table ablation on synthetic in {output_dir}: not running.\n"
                                "1 of 6 runs finished, 2 stopped, 3 not started.\n")
  assert not os.path.exists(os.path.join(output_dir, runner.TABLE_LOCK_FILE))  # nothing written
  wrong = subprocess.run(command[:5] + ["--rows=abs,rel_qv"] + command[6:], cwd=ROOT,
                         capture_output=True, text=True, check=False)
  assert wrong.returncode == 1
  assert wrong.stderr.strip().splitlines()[-1].startswith(
      "error: row 'rel_qv' is not in table 'ablation'; allowed: abs, ")
  assert "Traceback" not in wrong.stderr


def test_status_with_publish_to_writes_the_runs_in_flight_there(table, tmp_path):
  output_dir, _ = table
  published_dir = str(tmp_path / "docs")
  done = subprocess.run([
      sys.executable, "-m", "relpos.experiments.run", "--table=ablation", "--task=synthetic",
      "--rows=abs,rel_kv,none", "--seeds=2", "--order=seeds", f"--output_dir={output_dir}",
      f"--publish_to={published_dir}", "--status"
  ], cwd=ROOT, capture_output=True, text=True, check=True)
  path = os.path.join(published_dir, lost_runs.IN_FLIGHT_FILE)
  assert done.stdout.endswith(f"Wrote the runs in flight to {path} (commit it with the "
                              "results).\n")
  assert json_files.read_json(path)["runs"] == [  # the stopped ones; not the finished abs
      {"run": "synthetic-ablation-rel_kv-seed0", "step": 6, "checkpoint": 6, "num_steps": 8},
      {"run": "synthetic-ablation-none-seed0", "step": 4, "checkpoint": 2, "num_steps": 8},
  ]


def test_a_table_that_stops_publishes_its_runs_in_flight(table, tmp_path):
  """However the table ends (here refused before any work: its folder's configs are not ones
  it made), its runs in flight go beside its results, for a restart after a loss."""
  output_dir, _ = table
  published_dir = str(tmp_path / "docs")
  done = subprocess.run([
      sys.executable, "-m", "relpos.experiments.run", "--table=ablation", "--task=synthetic",
      "--rows=abs,rel_kv,none", "--seeds=2", "--order=seeds", f"--output_dir={output_dir}",
      f"--publish_to={published_dir}"
  ], cwd=ROOT, capture_output=True, text=True, check=False)
  assert done.returncode == 1 and "Traceback" not in done.stderr
  assert [
      run["run"]
      for run in json_files.read_json(os.path.join(published_dir, lost_runs.IN_FLIGHT_FILE))["runs"]
  ] == ["synthetic-ablation-rel_kv-seed0", "synthetic-ablation-none-seed0"]


def test_the_table_of_a_folder_is_read_from_its_run_names(table, tmp_path):
  output_dir, _ = table  # abs, rel_kv, none and rope of seed 0 have folders; t5's was replaced
  assert status.table_in_folder(output_dir) == {
      "table": "ablation", "task": "synthetic", "rows": ["abs", "rel_kv", "none", "rope"],
      "seeds": 1
  }
  sweep = tmp_path / "sweep"
  for name in ("tiny-k_sweep-k16-seed2", "tiny-k_sweep-k3-seed0", "tiny-k_sweep-k0-seed1",
               "tiny-k_sweep-kx-seed0", "tiny-ablation-myvariant-seed0"):
    os.makedirs(sweep / "runs" / name)
  with pytest.raises(
      ValueError, match=r"holds runs of several tables: ablation on tiny, "
      r"k_sweep on tiny; choose one with --table and --task\.$"):
    status.table_in_folder(str(sweep))
  assert status.table_in_folder(str(sweep), table="k_sweep") == {
      "table": "k_sweep", "task": "tiny", "rows": ["k=0", "k=3", "k=16"], "seeds": 3
  }
  # A variant of one's own not imported: its run is left out, the table's rows stand in.
  assert status.table_in_folder(str(sweep),
                                table="ablation")["rows"] == list(tables.TABLES["ablation"])
  assert status.table_in_folder(str(sweep), task="synthetic") is None
  assert status.table_in_folder(str(tmp_path / "empty")) is None


def test_status_of_a_folder_alone_reports_the_table_it_holds(tmp_path):
  for name in ("tiny-k_sweep-k16-seed1", "tiny-k_sweep-k3-seed0"):
    os.makedirs(tmp_path / "runs" / name)
  command = [sys.executable, "-m", "relpos.experiments.run", f"--output_dir={tmp_path}", "--status"]
  done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
  assert done.stdout.startswith(f"Table k_sweep on tiny in {tmp_path}: not running.\n"
                                "0 of 4 runs finished, 2 stopped, 2 not started.\n")
  assert "tiny-k_sweep-k3-seed1" in done.stdout and "Also in" not in done.stdout
  assert done.stdout.rstrip().endswith("(the table's own command with --status shows it).")
  # A flag given is kept, the others read from the folder.
  done = subprocess.run(command + ["--seeds=3"], cwd=ROOT, capture_output=True, text=True,
                        check=True)
  assert "0 of 6 runs finished, 2 stopped, 4 not started." in done.stdout
  empty = subprocess.run(command[:3] + [f"--output_dir={tmp_path / 'none'}", "--status"], cwd=ROOT,
                         capture_output=True, text=True, check=False)
  assert empty.returncode == 1 and empty.stderr.strip().splitlines()[-1] == (
      f"error: {tmp_path / 'none'} holds no runs of a table: give the table's own command with "
      "--status.")
