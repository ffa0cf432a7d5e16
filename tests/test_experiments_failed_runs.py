"""Tests for relpos.experiments.failed_runs: a failed run's record in its folder, and how
results.json (`results.collect_failed`), table.md and --status name it. The runner writing and
clearing it around a real failure is tested in test_experiments_runner.py."""

import json
import os

from relpos import json_files
from relpos import workdir_files
from relpos.experiments import failed_runs
from relpos.experiments import report
from relpos.experiments import results
from relpos.experiments import runner
from relpos.experiments import status


def _runs_dir(tmp_path) -> str:
  return str(tmp_path / "out" / "runs")


def test_a_failure_is_recorded_with_its_first_line_and_newest_checkpoint(tmp_path):
  workdir = os.path.join(_runs_dir(tmp_path), "synthetic-ablation-abs-seed0")
  os.makedirs(os.path.join(workdir, workdir_files.CHECKPOINT_DIR, "300"))
  os.makedirs(os.path.join(workdir, workdir_files.CHECKPOINT_DIR, "200"))
  failed_runs.record(workdir, "Non-finite loss at step 312\nmore detail\n")
  failure = failed_runs.read(workdir)
  assert (failure["error"], failure["checkpoint"],
          failure["log"]) == ("Non-finite loss at step 312", 300, None)
  failed_runs.clear(workdir)
  assert failed_runs.read(workdir) is None
  failed_runs.clear(workdir)  # nothing to remove: no error


def test_collect_failed_leaves_out_finished_and_moved_aside_runs(tmp_path):
  runs_dir = _runs_dir(tmp_path)
  for name in ("a-seed0", "b-seed0", "c-seed0.replaced-20261128T000000Z", "d-seed0"):
    failed_runs.record(os.path.join(runs_dir, name), "killed by SIGKILL", log="/x/run.log")
  json_files.write_json(os.path.join(runs_dir, "b-seed0", results.RESULT_FILE), {})
  os.makedirs(os.path.join(runs_dir, "e-seed0"))  # stopped, not failed
  failed = results.collect_failed(str(tmp_path / "out"))
  assert [f["run"] for f in failed] == ["a-seed0", "d-seed0"]
  assert failed_runs.describe(
      failed[0]) == (f"a-seed0 (killed by SIGKILL; failed {failed[0]['failed_at'][:10]} "
                     f"{failed[0]['failed_at'][11:19]} UTC, no checkpoint; log /x/run.log)")
  assert results.collect_failed(str(tmp_path / "nothing")) == []


def test_table_md_names_the_failed_runs_even_before_any_run_finished(tmp_path):
  failure = {
      "run": "synthetic-ablation-abs-seed0", "error": "a bug", "checkpoint": 8, "log": None,
      "failed_at": "2026-11-28T20:00:00+00:00"
  }
  path = tmp_path / "results.json"
  path.write_text(json.dumps({"schema_version": 5, "runs": [], "failed": [failure]}))
  text = report.write_table(str(path), str(tmp_path / "table.md"))
  assert text == (
      "# relpos results\n\nNo run has finished yet; `--status` with the table's command says "
      "where each stands.\n\nFailed, so left out of the table: synthetic-ablation-abs-seed0 (a "
      "bug; failed 2026-11-28 20:00:00 UTC, newest checkpoint step 8). The table's command "
      "trains each again from its newest checkpoint.\n")
  path.write_text(json.dumps({"schema_version": 5, "runs": []}))  # written before 28 Nov 2026
  assert "Failed" not in report.write_table(str(path), str(tmp_path / "table.md"))


def test_status_says_failed_and_names_the_error(tmp_path):
  output_dir = str(tmp_path / "out")
  runs = runner.table_runs("ablation", "synthetic", ["abs", "rel_kv"], [0], output_dir, "rows")
  failed_runs.record(runs[0].workdir, "a bug in evaluation")
  os.makedirs(runs[1].workdir)
  assert [status.run_status(run).state for run in runs] == ["failed", "stopped"]
  text = status.report("ablation", "synthetic", runs, output_dir)
  assert "0 of 2 runs finished, 1 failed, 1 stopped." in text
  assert text.splitlines()[-1].startswith(
      "Failed, so left out of the table: synthetic-ablation-abs-seed0 (a bug in evaluation; ")
