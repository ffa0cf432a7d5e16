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
  assert "| abs | 2 | 52.0 ± 1.4 | 51.0 ± 1.4 | 11.0 ± 1.4 | 26.5 (Table 1, base, EN-DE)" in text
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
      "Time per run (mean of 2): 16,050 s (4 h 27 min) = training 16,020 s (steps, ") == 1


def test_single_length_buckets_are_labelled_by_their_length():
  assert report.bucket_label("12-12") == report.bucket_label("12") == "12"
  assert report.bucket_label("3-5") == "3-5"
  runs = [fake_results.run_record("ablation", "abs", 0, 50.0, 10.0)]
  runs[0]["bleu_by_source_length"]["test"] = {"3-11": 60.0, "12-12": 40.0}
  assert "| row | 3-11 | 12 |" in report.render_table(runs)


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


def test_length_table_columns_and_diagnostics():
  text = report.render_table(fake_results.length_runs())
  # abs: test 97 ± 1, test_long 29 ± 1, oracle 63 ± 1; drop recovered (63 - 29) / (97 - 29)
  assert ("| abs | 3 | 97.0 ± 1.0 | 29.0 ± 1.0 | 63.0 ± 1.0 | 0.80 ± 0.00 | 60% ± 0% | "
          "10% ± 0% | 50% ± 0% |") in text
  assert "BLEU → BLEU at oracle length, by source length (words), test_long:" in text
  assert "| abs | 30.0 ± 1.0 → 64.0 ± 1.0 | 28.0 ± 1.0 → 62.0 ± 1.0 |" in text
  assert "| abs | 0.90 ± 0.00 (60% ± 0% short) | 0.70 ± 0.00 (60% ± 0% short) |" in text
  # Positions 0-7: 100%; 8-15: (4 x 20 x 0.5 + 4 x 9 x 0) / (4 x 20 + 4 x 9) = 34.5%.
  assert "| row | 0-7 | 8-15 | eos |" in text
  assert "| abs | 100.0 ± 0.0 | 34.5 ± 0.0 | 25.0 ± 0.0 |" in text
  assert "| abs | 0.50 ± 0.00 / 0.40 ± 0.00 | 0.70 ± 0.00 / 0.60 ± 0.00 |" in text
  assert "## The paper's findings" not in text  # a length table alone


def test_each_run_and_its_validation_curve(tmp_path):
  """Every run on its own line (rows in the table's order, then seeds), with the step it was
  scored at, its other checkpoint's scores, finish and commits; its time and validation curve."""
  runs = []
  for row, seed, bleu in (("rel_kv", 1, 41.0), ("abs", 0, 39.0), ("rel_kv", 0, 40.0)):
    run = fake_results.run_record("ablation", row, seed, bleu, 10.0)
    run["scores"]["test"].update(step=8000, bleu_lowercase=bleu + 0.4, chrf=60.0)
    run.update(
        wall_time_s=9_000.0, validation_curve=[[500, 7.0], [1000, bleu / 2]],
        other_checkpoints={"average:10": {"test": {"bleu": bleu + 1, "bleu_lowercase": bleu + 2}}},
        environment={"finished_at": "2026-11-24T08:23:20+00:00"},
        starts=[{"commit": "aaa1111", "step": 0}, {"commit": "bbb2222", "step": 800},
                {"commit": "bbb2222", "step": 900}])
    runs.append(run)
  runs[0]["validation_curve"].append([1500, 30.0])  # a step only one run validated
  runs[0]["time_s"] = {"training": 8_100.0, "validation": 720.0, "evaluation": 180.0}
  runs[1].pop("starts")  # a run from before starts were recorded: its one commit
  path = tmp_path / "results.json"
  path.write_text(json.dumps({"schema_version": 4, "runs": runs}))
  text = report.write_table(str(path), str(tmp_path / "table.md"))
  each_run = text[text.index("## ablation: each run"):]
  assert ("| row | seed | step scored | validation BLEU | test BLEU | test_long BLEU | test BLEU "
          "(lower-cased) | test chrF | test BLEU (average:10) | test BLEU (average:10, "
          "lower-cased) | finished (UTC) | commits (from step) |") in each_run
  run_lines = [
      line for line in each_run.splitlines()
      if line.startswith(("| abs", "| rel_kv")) and " s (" not in line  # not the time table
  ]
  assert run_lines[:3] == [
      "| rel_kv | 0 | 8,000 | 41.0 | 40.0 | 10.0 | 40.4 | 60.0 | 41.0 | 42.0 | 2026-11-24 08:23 | "
      "aaa1111 (0) bbb2222 (800) |",
      "| rel_kv | 1 | 8,000 | 42.0 | 41.0 | 10.0 | 41.4 | 60.0 | 42.0 | 43.0 | 2026-11-24 08:23 | "
      "aaa1111 (0) bbb2222 (800) |",
      f"| abs | 0 | 8,000 | 40.0 | 39.0 | 10.0 | 39.4 | 60.0 | 40.0 | 41.0 | "
      f"2026-11-24 08:23 | {runs[1]['commit']} |",
  ]
  assert ("| rel_kv | 0 | 9,000 s (2 h 30 min) | – | – | – | 10.00 |\n"
          "| rel_kv | 1 | 9,000 s (2 h 30 min) | 8,100 s (90.0%) | 720 s (8.0%) | 180 s (2.0%) | "
          "10.00 |") in each_run[each_run.index("## ablation: where each run's time went"):]
  assert "## ablation: validation BLEU by step" in each_run
  assert run_lines[3:] == [
      "| rel_kv | 0 | 7.0 | 20.0 | – |", "| rel_kv | 1 | 7.0 | 20.5 | 30.0 |",
      "| abs | 0 | 7.0 | 19.5 | – |"
  ]
  # Runs without curves (schema 1) get no curve table; columns no run has are left out.
  bare = report.render_table(fake_results.few_seeds())
  assert "## ablation: each run" in bare and "validation BLEU by step" not in bare
  assert "chrF" not in bare and "finished (UTC)" in bare


def test_each_run_gives_the_literatures_tokenized_bleu_where_a_run_has_it(tmp_path):
  """Lower-cased Moses-tokenized BLEU (`relpos.scoring`), of the scored checkpoint and of each
  other choice, for the runs scored since it was measured; "–" for older ones; its signature
  once under the title. The mean table leaves it out."""
  signature = "pre:moses-lc-norm-tok:de|sacremoses:0.2.0|nrefs:1|tok:none"
  runs = []
  for row, bleu, tokenized in (("abs", 39.0, None), ("rel_kv", 40.0, 41.5)):
    run = fake_results.run_record("ablation", row, 0, bleu, 10.0)
    run["scores"]["test"].update(bleu_lowercase=bleu + 0.4)
    run["other_checkpoints"] = {"average:10": {"test": {"bleu": bleu + 1}}}
    if tokenized is not None:
      run["scores"]["test"].update(bleu_tokenized_lowercase=tokenized,
                                   tokenized_lowercase_signature=signature)
      run["other_checkpoints"]["average:10"]["test"]["bleu_tokenized_lowercase"] = tokenized + 1
    runs.append(run)
  text = report.render_table(runs)
  each_run = text[text.index("## ablation: each run"):]
  assert ("| test BLEU (lower-cased) | test BLEU (lower-cased, tokenized) | test BLEU (average:10) "
          "| test BLEU (average:10, lower-cased, tokenized) |") in each_run
  assert "| abs | 0 | 40.0 | 39.0 | 10.0 | 39.4 | – | 40.0 | – |" in each_run
  assert "| rel_kv | 0 | 41.0 | 40.0 | 10.0 | 40.4 | 41.5 | 41.0 | 42.5 |" in each_run
  assert f"(`relpos.scoring`; `{signature}`)" in text[:text.index("## ablation")]
  mean_table = text[text.index("## ablation\n"):text.index("BLEU by source length")]
  assert "| test BLEU (lower-cased) | test BLEU (average:10) |" in mean_table
  assert "tokenized" not in mean_table


def test_a_run_restored_twice_names_both_losses():
  runs = [fake_results.run_record("ablation", row, 0, 40.0, 10.0) for row in ("abs", "rel_kv")]
  runs[0]["restored"] = {
      "from": "docs/results/t/results.json", "at": "2026-11-26T08:37:46+00:00",
      "earlier": [{"from": "docs/results/t/results.json", "at": "2026-11-25T00:36:05+00:00"}]
  }
  runs[1]["restored"] = {"from": "docs/results/t/results.json", "at": "2026-11-26T08:37:46+00:00"}
  text = report.render_table(runs)
  assert ("Restored from `docs/results/t/results.json` on 2026-11-25 and 2026-11-26 "
          "(`--restore_from`") in text
  assert text.count("Restored from") == 2 and "on 2026-11-26 (`--restore_from`" in text
