"""Tests for relpos.experiments.report_length: the sections of table.md on why longer sentences
fail (the length table, BLEU by what a split holds, the diagnostics by length and position)."""

from relpos.experiments import report
from relpos.experiments import report_length
import fake_results


def test_single_length_buckets_are_labelled_by_their_length():
  assert report_length.bucket_label("12-12") == report_length.bucket_label("12") == "12"
  assert report_length.bucket_label("3-5") == "3-5"
  runs = [fake_results.run_record("ablation", "abs", 0, 50.0, 10.0)]
  runs[0]["bleu_by_source_length"]["test"] = {"3-11": 60.0, "12-12": 40.0}
  assert "| row | 3-11 | 12 |" in report.render_table(runs)


def test_sentences_at_length_reads_the_first_run_that_counts_them():
  runs = [fake_results.run_record("ablation", "abs", 0, 50.0, 10.0)] + fake_results.length_runs()
  runs[1]["length_statistics"]["test_long"]["by_source_length"]["19-24"]["num_sentences"] = 7
  assert report_length.sentences_at_length(runs, "test_long", "19-24") == 7
  assert report_length.sentences_at_length(runs, "test_long", "25-30") is None
  assert report_length.sentences_at_length(runs[:1], "test", "3-6") is None  # not counted


def test_length_table_columns_and_diagnostics():
  text = report.render_table(fake_results.length_runs())
  # abs: test 97 ± 1, test_long 29 ± 1, oracle 63 ± 1; drop recovered (63 - 29) / (97 - 29)
  assert ("| abs | 3 | 97.0 ± 1.0 | 29.0 ± 1.0 | 63.0 ± 1.0 | 0.80 ± 0.00 | 60% ± 0% | "
          "10% ± 0% | 50% ± 0% |") in text
  assert "BLEU → BLEU at oracle length, by source length (words), test_long:" in text
  assert "| abs | 30.0 ± 1.0 → 64.0 ± 1.0 | 28.0 ± 1.0 → 62.0 ± 1.0 |" in text
  assert "| sentences | 10 | 10 |" in text  # under each bucket table, from length_statistics
  assert "| abs | 0.90 ± 0.00 (60% ± 0% short) | 0.70 ± 0.00 (60% ± 0% short) |" in text
  # Positions 0-7: 100%; 8-15: (4 x 20 x 0.5 + 4 x 9 x 0) / (4 x 20 + 4 x 9) = 34.5%.
  assert "| row | 0-7 | 8-15 | eos |" in text
  assert "| abs | 100.0 ± 0.0 | 34.5 ± 0.0 | 25.0 ± 0.0 |" in text
  assert "| abs | 0.50 ± 0.00 / 0.40 ± 0.00 | 0.70 ± 0.00 / 0.60 ± 0.00 |" in text
  assert "## The paper's findings" not in text  # a length table alone
  assert "BLEU by what test_long holds (sentences):" in text
  assert "| row | seen constructions (2) | 2 clauses (8) |" in text
  assert "| abs | 59.0 ± 1.0 | 24.0 ± 1.0 |" in text
  assert "BLEU by what test holds" not in text  # runs scored without test subsets


def test_subset_cells_say_how_many_runs_they_average():
  """A table resumed across commits holds runs scored before subsets were: their cells average
  the others and say so, as the seeds column counts them all."""
  runs = fake_results.length_runs()
  for run in runs:
    if run["row"] == "abs" and run["seed"] == 0:
      del run["scores"]["test_long"]["bleu_by_subset"]
  lines = report_length.subset_lines([r for r in runs if r["table"] == "length"], ["abs", "rel_kv"])
  assert "| abs | 59.5 ± 0.7 (2 of 3 runs) | 24.5 ± 0.7 (2 of 3 runs) |" in lines
  assert "| rel_kv | 57.0 ± 2.0 | 22.0 ± 2.0 |" in lines
  assert report_length.subset_lines([fake_results.run_record("ablation", "abs", 0, 50.0, 10.0)],
                                    ["abs"]) == []  # runs without subsets: no section


def test_length_and_accuracy_cells_say_how_many_runs_they_average():
  """A run without oracle-length scores (scored before they existed) or with fewer targets in
  a position range than MIN_TOKENS_PER_POSITION leaves the cell to the others, which says so."""
  runs = fake_results.length_runs()
  for run in runs:
    if run["row"] == "abs" and run["seed"] == 0:
      del run["oracle_length"]
      counts = run["token_accuracy_by_position"]["test_long"]["count"]
      counts[8:16] = [1] * 8  # 8 targets in positions 8-15: too few to show
  text = report.render_table(runs)
  assert ("| abs | 3 | 97.0 ± 1.0 | 29.0 ± 1.0 | 63.5 ± 0.7 (2 of 3 runs) | 0.80 ± 0.00 | "
          "60% ± 0% | 10% ± 0% | 50% ± 0% (2 of 3 runs) |") in text
  test_long_accuracy = text.split("eos, test_long")[1]
  assert "| abs | 100.0 ± 0.0 | 34.5 ± 0.0 (2 of 3 runs) | 25.0 ± 0.0 |" in test_long_accuracy


def test_early_eos_is_a_column_where_runs_measure_it():
  runs = fake_results.length_runs()
  assert "eos predicted early" not in report.render_table(runs)  # runs from before it
  for run in runs:
    if not (run["row"] == "abs" and run["seed"] == 0):
      run["token_accuracy_by_position"]["test_long"]["early_eos"] = 0.02 * (1 + run["seed"])
  test_long_accuracy = report.render_table(runs).split("eos, test_long")[1]
  assert "| row | 0-7 | 8-15 | eos | eos predicted early (%) |" in test_long_accuracy
  assert "| abs | 100.0 ± 0.0 | 34.5 ± 0.0 | 25.0 ± 0.0 | 5.0 ± 1.4 (2 of 3 runs) |" in (
      test_long_accuracy)
  assert "| rel_kv | 100.0 ± 0.0 | 34.5 ± 0.0 | 25.0 ± 0.0 | 4.0 ± 2.0 |" in test_long_accuracy
