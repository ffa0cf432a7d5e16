"""Tests for relpos.experiments.report_runs: table.md's sections run by run (each run's
scores, restored runs, where its time went, its validation curve), through the whole table."""

import json

from relpos.experiments import report
from relpos.experiments import report_runs
from relpos.experiments import tables
import fake_results


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
  runs[1].pop("machine_load")  # and before its machine's load was
  runs[2]["machine_load"] = {
      "median_load_average": 3.44, "cpus": 2, "loaded_share": 0.31, "unrecorded_share": 0.0
  }
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
  assert ("| rel_kv | 0 | 9,000 s (2 h 30 min) | – | – | – | 10.00 | 3.4 / 2 cores, loaded 31% |\n"
          "| rel_kv | 1 | 9,000 s (2 h 30 min) | 8,100 s (90.0%) | 720 s (8.0%) | 180 s (2.0%) | "
          "10.00 | 1.5 / 2 cores |\n"
          "| abs | 0 | 9,000 s (2 h 30 min) | – | – | – | 10.00 | – |"
         ) in each_run[each_run.index("## ablation: where each run's time went"):]
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


def _run_made_with(row, seed, overrides, *, drop=None):
  """A fake run whose config is its row's recipe with `overrides` (and without the dotted field
  `drop`, as a config saved before that field existed)."""
  run = fake_results.run_record("ablation", row, seed, 40.0, 10.0)
  run["config"] = json.loads(tables.one_run_config(row, seed, "synthetic", overrides).to_json())
  if drop:
    section, name = drop.split(".")
    del run["config"][section][name]
  return run


def test_table_md_says_how_the_runs_were_made_otherwise_than_their_recipes():
  """The overrides of the table's command (table.md said nothing of them), and fields older
  configs lack, grouped by the runs they hold for; no line where every run is its recipe."""
  assert report_runs.recipe_lines([_run_made_with("abs", 0, {})]) == []
  runs = [
      _run_made_with("abs", 0, {"train.num_steps": 5}, drop="train.max_skipped_fraction"),
      _run_made_with("shape", 0, {"train.num_steps": 5, "model.shape_max_shift": 500}),
      _run_made_with("shape", 1, {"train.num_steps": 5, "model.shape_max_shift": 500}),
      {**fake_results.run_record("ablation", "kerple", 0, 40.0, 10.0), "config": {}},  # not read
  ]
  assert report_runs.recipe_lines(runs[:3]) == [
      "Made otherwise than each row's recipe (the task's config with the row's fields), in "
      "every run: `train.num_steps=5` (recipe 1000); in abs seed 0: no "
      "`train.max_skipped_fraction` (recipe 0.01; the config predates it); in shape seeds 0, 1: "
      "`model.shape_max_shift=500` (recipe 16).", ""
  ]
  # A run whose config cannot be read (a variant not imported) is compared with nothing.
  assert ("in abs seed 0, shape seeds 0, 1: `train.num_steps=5` (recipe 1000)"
          in report_runs.recipe_lines(runs)[0])
  assert "Made otherwise" in report.render_table(runs[:3])


def test_a_bootstrap_p_at_the_least_its_resamples_give_reads_as_a_bound():
  cell = lambda p, resamples: report_runs._bootstrap_cell(  # pylint: disable=protected-access
      {"difference": 2.06, "p_value": p, "signature": f"nrefs:1|bs:{resamples}|seed:12345"})
  assert cell(1 / 1001, 1000) == "+2.1 (p ≤ 0.001)"  # no resample as far apart
  assert cell(1 / 1001, 10000) == "+2.1 (p = 0.001)"  # 10 of 10,000 resamples
  assert cell(0.031, 1000) == "+2.1 (p = 0.031)"
