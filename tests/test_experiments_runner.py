"""Tests for relpos.experiments.runner: a tiny two-row table, resume, outputs."""

import datetime
import json
import os

import flax
import jax
import pytest

from relpos import metrics_writer
from relpos.experiments import run as run_cli
from relpos.experiments import report
from relpos.experiments import runner


def _tiny_overrides(data_dir: str) -> dict[str, object]:
  return {
      "task.tfds_data_dir": data_dir,
      "task.vocab_size": 64,
      "task.synthetic.num_train": 200,
      "task.synthetic.num_validation": 8,
      "task.synthetic.num_test": 8,
      "task.synthetic.num_test_long": 8,
      "model.emb_dim": 16, "model.qkv_dim": 16, "model.mlp_dim": 32, "model.num_heads": 2,
      "model.num_encoder_layers": 1, "model.num_decoder_layers": 1,
      "train.num_steps": 4, "train.batch_size": 8, "train.eval_batch_size": 8,
      "train.log_every_steps": 2, "train.eval_every_steps": 4,
      "train.checkpoint_every_steps": 4, "train.warmup_steps": 2,
  }


@pytest.fixture(scope="module")
def finished_table(tmp_path_factory):
  root = tmp_path_factory.mktemp("table")
  output_dir = str(root / "out")
  outputs = runner.run_table("ablation", task="synthetic", seeds=[0], output_dir=output_dir,
                             rows=["abs", "rel_kv"],
                             overrides=_tiny_overrides(str(root / "tfds")))
  return root, output_dir, outputs


def test_two_rows_one_seed_write_results_table_and_plots(finished_table):
  _, output_dir, outputs = finished_table
  assert not outputs["preempted"]
  with open(os.path.join(output_dir, "results.json")) as f:
    results = json.load(f)
  runs = results["runs"]
  written = datetime.datetime.fromisoformat(results["written_at"])
  assert written.tzinfo == datetime.timezone.utc
  assert datetime.timedelta(0) <= datetime.datetime.now(datetime.timezone.utc) - written < (
      datetime.timedelta(hours=1))
  environment = {"jax_version": jax.__version__, "flax_version": flax.__version__,
                 "device_kind": jax.devices()[0].device_kind, "device_count": jax.device_count()}
  assert results["schema_version"] == report.RESULTS_SCHEMA_VERSION == 2
  assert {k: results[k] for k in environment} == environment
  for run in runs:
    assert {k: run["environment"][k] for k in environment} == environment
    assert datetime.datetime.fromisoformat(run["environment"]["finished_at"]) <= written
  assert [(r["table"], r["row"], r["seed"]) for r in runs] == [
      ("ablation", "abs", 0), ("ablation", "rel_kv", 0)]
  for run in runs:
    assert set(run["scores"]) == {"validation", "test", "test_long"}
    assert run["scores"]["test"]["num_sentences"] == 8
    assert 0.0 <= run["scores"]["test"]["bleu"] <= 100.0
    assert run["scores"]["test"]["signature"].startswith("nrefs:1")
    assert run["num_params"] > 0 and run["steps_per_second"] > 0
    assert run["config"]["seed"] == 0 and run["config"]["train"]["num_steps"] == 4
    assert set(run["bleu_by_source_length"]) == {"test", "test_long"}
    stats = run["position_statistics"]
    assert len(stats["attention_by_offset"]) == 1  # one encoder layer
    assert isinstance(stats["longest_distance"], int) and stats["longest_distance"] >= 2
    validations = [r for r in metrics_writer.read_metrics(run["workdir"])
                   if r["split"] == "validation"]
    assert run["validation_curve"] == [[r["step"], r["bleu"]] for r in validations]
    assert [step for step, _ in run["validation_curve"]] == [4]
  rel = runs[1]
  assert rel["config"]["model"]["position"] == "relative"
  assert len(rel["position_statistics"]["qak_by_offset"][0]) == 2 * 16 + 1
  assert "qak_by_offset" not in runs[0]["position_statistics"]
  table = open(os.path.join(output_dir, "table.md")).read()
  assert "| abs | 1 |" in table and "| rel_kv | 1 |" in table
  assert outputs["table"] == table
  names = sorted(os.path.basename(p) for p in outputs["plots"])
  assert names == ["attention_by_offset.png", "bleu_vs_length.png", "bleu_vs_step.png",
                   "qak_by_offset.png"]


def test_rerun_skips_finished_rows(finished_table, monkeypatch):
  root, output_dir, _ = finished_table
  before = os.path.getmtime(os.path.join(output_dir, "runs", "ablation-abs-seed0",
                                         "result.json"))

  def fail(*args, **kwargs):
    raise AssertionError("a finished run was trained again")

  monkeypatch.setattr(runner.train, "train_and_evaluate", fail)
  runner.run_table("ablation", task="synthetic", seeds=[0], output_dir=output_dir,
                   rows=["abs", "rel_kv"], overrides=_tiny_overrides(str(root / "tfds")))
  assert os.path.getmtime(os.path.join(output_dir, "runs", "ablation-abs-seed0",
                                       "result.json")) == before


def test_unknown_row_and_override_fail_before_any_work(tmp_path):
  with pytest.raises(ValueError, match="row 'k=4' is not in table 'ablation'"):
    runner.run_table("ablation", task="synthetic", seeds=[0], output_dir=str(tmp_path),
                     rows=["k=4"])
  with pytest.raises(ValueError, match="no config field 'num_stepz'"):
    runner.run_table("ablation", task="synthetic", seeds=[0], output_dir=str(tmp_path),
                     rows=["abs"], overrides={"train.num_stepz": 3})
  assert not os.listdir(tmp_path)


def test_length_buckets_cover_every_sentence():
  sources = ["a b c", "a b c d e f", "a " * 11, "a " * 12]
  edges = runner.length_edges(sources)
  assert edges == [3, 6, 9, 12]
  scores = runner.bleu_by_source_length(sources, ["x y"] * 4, ["x y"] * 4)
  assert list(scores) == ["3-5", "6-8", "9-11", "12"]


def test_parse_override():
  assert run_cli.parse_override("train.num_steps=100") == ("train.num_steps", 100)
  assert run_cli.parse_override("task.name=multi30k") == ("task.name", "multi30k")
  assert run_cli.parse_override("model.relative_key=False") == ("model.relative_key", False)
  with pytest.raises(ValueError, match="dotted.field=value"):
    run_cli.parse_override("train.num_steps")
