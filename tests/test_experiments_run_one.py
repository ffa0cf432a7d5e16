"""Tests for relpos.experiments.run_one, the child process a table starts for each run with
--parallel: it trains and evaluates one (row, seed) in its workdir and writes its result.json;
started again on a finished run, it returns that result without training. (Children stopped by
their table: test_experiments_children.py.)"""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_one_run_is_trained_and_scored_in_its_workdir_once(tmp_path):
  workdir = tmp_path / "tiny-k_sweep-k3-seed1"
  command = [
      sys.executable, "-m", "relpos.experiments.run_one", "--table=k_sweep", "--row=k=3",
      "--seed=1", "--task=tiny", f"--workdir={workdir}", "--set=train.num_steps=2",
      "--set=train.eval_every_steps=2", "--set=decode.validation_bleu=False",
      "--set=decode.length_diagnostics=False", f"--set=task.tfds_data_dir={tmp_path / 'data'}"
  ]
  done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  result_path = workdir / "result.json"
  result = json.loads(result_path.read_text())
  assert (result["table"], result["row"], result["seed"], result["task"],
          result["k"]) == ("k_sweep", "k=3", 1, "tiny", 3)
  assert result["config"]["seed"] == 1
  assert json.loads((workdir / "config.json").read_text())["model"]["max_relative_position"] == 3
  assert "bleu" in result["scores"]["test"]
  written = os.stat(result_path).st_mtime_ns
  again = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
  assert again.returncode == 0, again.stderr[-3000:]
  assert os.stat(result_path).st_mtime_ns == written  # finished: nothing trained or written
  assert "Resuming" not in again.stderr
