"""Tests for relpos.experiments.run, the tables' command: its listing, and a one-run table set
through --config.<field> and --set, published and restored. (Its one-line mistakes:
test_cli.py; tables run through it: test_experiments_runner.py, test_experiments_status.py,
test_variants.py.)"""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_experiments_list_names_tables_rows_tasks_and_variants_with_their_fields():
  done = subprocess.run([sys.executable, "-m", "relpos.experiments.run", "--list"], cwd=ROOT,
                        capture_output=True, text=True, check=True)
  lines = done.stdout.strip().splitlines()
  assert lines[0] == ("table ablation: abs, rel_kv, rel_k, rel_v, none, t5, abs_rel_kv, rope, "
                      "alibi (with --rows also: fire, shape, randomized, rel_kv_concat)")
  assert lines[1] == "table k_sweep: k=0, k=1, k=2, k=4, k=16, k=64, k=256 (or any k=<int>)"
  assert lines[2] == ("table length: abs, rel_kv, t5, rope, alibi, fire, shape, randomized, "
                      "rel_kv_concat (with --rows also: rel_k, rel_v, none, abs_rel_kv)")
  assert lines[3] == "tasks: synthetic, multi30k, multi30k_gpu, tiny, wmt14"
  assert lines[4] == "position variants (model.position), their fields:"
  variants = lines[5:]
  assert variants[:3] == [
      "  none: no fields", "  absolute",
      "    model.absolute_type='sinusoidal': sinusoidal | t2t_timing_signal | learned"
  ]
  assert "    model.max_relative_position=16: k: distances clipped to [-k, k]" in variants
  assert [line.strip() for line in variants if not line.startswith("    ")] == [
      "none: no fields", "absolute", "relative", "t5", "rope", "alibi: no fields", "fire", "shape",
      "randomized"
  ]


def test_experiments_take_config_overrides_any_k_and_any_base(tmp_path):
  """A one-run table: k=3 (off the paper's grid) on the tiny base, its budget set with
  --config.<field> and --set alike; --publish_to copies it out, and --restore_from writes it
  back into another output folder without training it again."""
  data_dir = tmp_path / "data"
  command = [
      sys.executable, "-m", "relpos.experiments.run", "--table=k_sweep", "--task=tiny",
      "--rows=k=3", "--config.train.num_steps=2", "--config.decode.validation_bleu=False",
      "--config.decode.length_diagnostics=False", f"--config.task.tfds_data_dir={data_dir}",
      "--set=train.eval_every_steps=2"
  ]
  done = subprocess.run(
      command + [f"--output_dir={tmp_path}/out", f"--publish_to={tmp_path}/published"], cwd=ROOT,
      capture_output=True, text=True, check=True)
  assert f"Copied them and the runs' test translations to {tmp_path}/published." in done.stdout
  done = subprocess.run(
      command +
      [f"--output_dir={tmp_path}/lost", f"--restore_from={tmp_path}/published/results.json"],
      cwd=ROOT, capture_output=True, text=True, check=True)
  assert "restored as finished" in done.stdout and "training and evaluating" not in done.stdout
  assert "Restored from" in open(tmp_path / "lost" / "table.md", encoding="utf-8").read()
  with open(tmp_path / "out" / "runs" / "tiny-k_sweep-k3-seed0" / "result.json") as f:
    result = json.load(f)
  assert result["k"] == 3 and result["config"]["model"]["max_relative_position"] == 3
  train = result["config"]["train"]
  assert (train["num_steps"], train["eval_every_steps"], train["batch_size"]) == (2, 2, 8)


def test_list_with_a_variant_named_like_a_row_says_so_in_one_line(tmp_path):
  module = tmp_path / "row_named.py"
  module.write_text("from relpos import variants\n\n\n"
                    "@variants.register('rel_kv_concat')\n"
                    "class RowNamed(variants.Variant):\n"
                    "  pass\n")
  done = subprocess.run(
      [sys.executable, "-m", "relpos.experiments.run", "--list", f"--import={module}"], cwd=ROOT,
      capture_output=True, text=True, check=False)
  assert done.returncode == 1, done.stderr
  assert done.stderr.strip().splitlines()[-1].startswith(
      "error: position variant 'rel_kv_concat' (")
  assert "Traceback" not in done.stderr
