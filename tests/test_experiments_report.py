"""Tests for relpos.experiments.report: table.md from results.json alone."""

import json

import pytest

from relpos.experiments import plots
from relpos.experiments import report
from relpos.experiments import verdicts
import fake_results


def test_load_runs_reads_older_schemas_and_refuses_newer_ones(results_path, tmp_path):
  assert len(report.load_runs(str(results_path))) == 11  # version 1: no schema_version field
  newer = tmp_path / "newer.json"
  newer.write_text(json.dumps({"schema_version": report.RESULTS_SCHEMA_VERSION + 1, "runs": []}))
  version = report.RESULTS_SCHEMA_VERSION + 1
  with pytest.raises(ValueError, match=f"{newer}: schema_version={version} is newer"):
    report.load_runs(str(newer))


def test_table_rebuilt_from_results_json_alone(results_path, tmp_path):
  text = report.write_table(str(results_path), str(tmp_path / "table.md"))
  assert (tmp_path / "table.md").read_text() == text
  assert ("| abs | 2 | 52.0 ± 1.4 | 51.0 ± 1.4 | 11.0 ± 1.4 | 26.5 (Table 1, newstest2014; rel_kv "
          "26.8 there)") in text
  assert "| rel_kv | 2 | 62.0 ± 1.4 | 61.0 ± 1.4 | 41.0 ± 1.4 |" in text
  assert "| k=0 | 1 | 21.0 | 20.0 | 30.0 | 12.5 |" in text
  # Per-length buckets, sorted by their first length.
  assert "| row | 13-18 | 19-24 |" in text
  assert "| rel_kv | 42.0 ± 1.4 | 40.0 ± 1.4 |" in text
  assert "Time per run" not in text  # these runs (schema 1) record no time_s


def test_table_says_where_the_time_went(tmp_path):
  runs = [{
      **fake_results.run_record("ablation", "abs", seed, 50.0, 10.0), "wall_time_s": total,
      "time_s": {"training": total - 30.0, "validation": 10.0, "evaluation": 20.0}
  } for seed, total in ((0, 100.0), (1, 140.0))]
  path = tmp_path / "results.json"
  path.write_text(json.dumps({"schema_version": 3, "runs": runs}))
  text = report.write_table(str(path), str(tmp_path / "table.md"))
  assert ("Time per run (mean of 2): 120 s = training 90 s (steps, compilation, checkpoints) + "
          "validation during training 10 s + final evaluation 20 s (every split, position "
          "statistics, length diagnostics).") in text
  runs[1]["wall_time_s"], runs[1]["time_s"]["training"] = 32_000.0, 31_970.0  # hours: readable
  path.write_text(json.dumps({"schema_version": 3, "runs": runs}))
  assert report.write_table(str(path), str(tmp_path / "table.md")).count(
      "Time per run (mean of 2): 16,050 s (4 h 28 min) = training 16,020 s (steps, ") == 1


def test_table_before_any_run_finished_says_so():
  assert report.render_table([]).startswith("# relpos results\n\nNo run has finished yet;")


def test_table_of_a_task_with_its_own_test_split(tmp_path):
  def multi30k_run(row, bleu):
    scores = {
        "bleu": bleu, "bleu_lowercase": bleu + 2, "signature": "case:mixed|tok:13a",
        "lowercase_signature": "case:lc|tok:13a"
    }
    return {
        "table": "ablation", "row": row, "seed": 0, "k": None, "task": "multi30k",
        "commit": "abc1234", "wall_time_s": 60.0, "steps_per_second": 1.0, "num_params": 1000,
        "config": {}, "scores": {"validation": {"bleu": bleu - 1}, "test_2016_flickr": scores},
        "bleu_by_source_length": {"test_2016_flickr": {"1-10": bleu + 1, "11-20": bleu - 1}}
    }

  runs = [multi30k_run("abs", 30.0), multi30k_run("rel_kv", 31.0), multi30k_run("none", 10.0)]
  path = tmp_path / "results.json"
  path.write_text(json.dumps({"runs": runs}))
  text = report.write_table(str(path), str(tmp_path / "table.md"))
  assert ("| row | seeds | validation BLEU | test_2016_flickr BLEU | "
          "test_2016_flickr BLEU (lower-cased) |") in text
  assert "| rel_kv | 1 | 30.0 | 31.0 | 33.0 |" in text
  assert "sacreBLEU signature: `case:mixed|tok:13a`" in text
  assert "| rel_kv | 32.0 | 30.0 |" in text  # per-length buckets of the task's test split
  judged = {f.split(" ")[0]: v for f, v, _ in verdicts.findings(runs)}
  assert judged["1."] == judged["2."] == "not enough seeds"
  assert sorted(p.rsplit("/", 1)[1] for p in plots.plot_results(str(path), str(tmp_path))) == [
      "bleu_vs_length.png"
  ]


def test_a_checkpoint_choice_some_runs_lack_says_how_many_runs_it_averages():
  """A run reused from before decode.other_checkpoints asked for average:10 has no such score:
  the mean of the others says so beside it, not beside the row's seeds count."""
  runs = [fake_results.run_record("ablation", "abs", seed, 39.0 + seed, 10.0) for seed in range(3)]
  for run in runs[1:]:
    run["other_checkpoints"] = {"average:10": {"test": {"bleu": run["scores"]["test"]["bleu"] + 1}}}
  mean_table = report.render_table(runs).split("## ablation\n")[1]
  assert "| abs | 3 |" in mean_table and "| 41.5 ± 0.7 (2 of 3 runs) |" in mean_table
