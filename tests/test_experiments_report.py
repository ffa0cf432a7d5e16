"""Tests for relpos.experiments.report and .plots: table.md and PNGs from results.json alone."""

import json

import pytest

from relpos.experiments import plots
from relpos.experiments import report


def _run(table, row, seed, test, long, *, k=None, speed=10.0):
  return {
      "table": table, "row": row, "seed": seed, "k": k, "task": "synthetic",
      "commit": "abc1234", "wall_time_s": 60.0, "steps_per_second": speed,
      "num_params": 1000, "config": {},
      "scores": {"validation": {"bleu": test + 1}, "test": {"bleu": test},
                 "test_long": {"bleu": long}},
      "bleu_by_source_length": {"test": {"3-6": test + 2, "7-12": test - 2},
                                "test_long": {"13-18": long + 1, "19-24": long - 1}},
  }


@pytest.fixture
def results_path(tmp_path):
  runs = [
      _run("ablation", "abs", 0, 50.0, 10.0, speed=10.0),
      _run("ablation", "abs", 1, 52.0, 12.0, speed=10.0),
      _run("ablation", "rel_kv", 0, 60.0, 40.0, speed=9.6),
      _run("ablation", "rel_kv", 1, 62.0, 42.0, speed=9.6),
      _run("ablation", "none", 0, 20.0, 5.0),
      _run("ablation", "rel_k", 0, 61.0, 41.0),
      _run("ablation", "rel_v", 0, 30.0, 20.0),
  ] + [_run("k_sweep", f"k={k}", 0, 20.0 if k == 0 else 60.0, 30.0, k=k) for k in (0, 1, 2, 4)]
  path = tmp_path / "results.json"
  path.write_text(json.dumps({"runs": runs}))
  return path


def test_load_runs_reads_older_schemas_and_refuses_newer_ones(results_path, tmp_path):
  assert len(report.load_runs(str(results_path))) == 11  # version 1: no schema_version field
  newer = tmp_path / "newer.json"
  newer.write_text(json.dumps({"schema_version": report.RESULTS_SCHEMA_VERSION + 1, "runs": []}))
  with pytest.raises(ValueError, match=f"{newer}: schema_version=3 is newer"):
    report.load_runs(str(newer))


def test_mean_std():
  assert report.mean_std([1.0]) == (1.0, 0.0)
  mean, std = report.mean_std([1.0, 3.0])
  assert mean == 2.0 and std == pytest.approx(2 ** 0.5)


def test_table_rebuilt_from_results_json_alone(results_path, tmp_path):
  text = report.write_table(str(results_path), str(tmp_path / "table.md"))
  assert (tmp_path / "table.md").read_text() == text
  assert "| abs | 2 | 52.0 ± 1.4 | 51.0 ± 1.4 | 11.0 ± 1.4 | 26.5 (Table 1, base, EN-DE)" in text
  assert "| rel_kv | 2 | 62.0 ± 1.4 | 61.0 ± 1.4 | 41.0 ± 1.4 |" in text
  assert "| k=0 | 1 | 21.0 | 20.0 | 30.0 | 12.5 |" in text
  # Per-length buckets, sorted by their first length.
  assert "| row | 13-18 | 19-24 |" in text
  assert "| rel_kv | 42.0 ± 1.4 | 40.0 ± 1.4 |" in text


def test_findings_verdicts(results_path):
  by_number = {f.split(" ")[0]: v for f, v, _ in report.findings(
      report.load_runs(str(results_path)))}
  assert len(by_number) == 8
  assert by_number["1."] == "yes"  # 61 vs 51
  assert by_number["2."] == "yes"  # none 20 vs 61
  assert by_number["2b."] == "yes"  # k=0 20 vs 61
  assert by_number["3."] == "yes"  # k=2,4 both 60
  assert by_number["4a."] == "yes"  # rel_k 61 vs 61
  assert by_number["4b."] == "no"  # rel_v 30: less than half way from 20 to 61
  assert by_number["5."] == "yes"  # 4% drop
  assert by_number["6."] == "yes"  # 41 vs 11


def test_findings_not_run_when_rows_missing():
  runs = [_run("ablation", "abs", 0, 50.0, 10.0)]
  verdicts = {f.split(" ")[0]: v for f, v, _ in report.findings(runs)}
  assert set(verdicts.values()) == {"not run"}


def test_plots_are_written(results_path, tmp_path):
  paths = plots.plot_results(str(results_path), str(tmp_path))
  assert sorted(p.rsplit("/", 1)[1] for p in paths) == ["bleu_vs_k.png", "bleu_vs_length.png"]
  for p in paths:
    with open(p, "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_table_of_a_task_with_its_own_test_split(tmp_path):
  def multi30k_run(row, bleu):
    scores = {"bleu": bleu, "bleu_lowercase": bleu + 2, "signature": "case:mixed|tok:13a",
              "lowercase_signature": "case:lc|tok:13a"}
    return {"table": "ablation", "row": row, "seed": 0, "k": None, "task": "multi30k",
            "commit": "abc1234", "wall_time_s": 60.0, "steps_per_second": 1.0,
            "num_params": 1000, "config": {},
            "scores": {"validation": {"bleu": bleu - 1}, "test_2016_flickr": scores},
            "bleu_by_source_length": {"test_2016_flickr": {"1-10": bleu + 1, "11-20": bleu - 1}}}

  runs = [multi30k_run("abs", 30.0), multi30k_run("rel_kv", 31.0), multi30k_run("none", 10.0)]
  path = tmp_path / "results.json"
  path.write_text(json.dumps({"runs": runs}))
  text = report.write_table(str(path), str(tmp_path / "table.md"))
  assert ("| row | seeds | validation BLEU | test_2016_flickr BLEU | "
          "test_2016_flickr BLEU (lower-cased) |") in text
  assert "| rel_kv | 1 | 30.0 | 31.0 | 33.0 |" in text
  assert "sacreBLEU signature: `case:mixed|tok:13a`" in text
  assert "| rel_kv | 32.0 | 30.0 |" in text  # per-length buckets of the task's test split
  verdicts = {f.split(" ")[0]: v for f, v, _ in report.findings(runs)}
  assert verdicts["1."] == "yes" and verdicts["2."] == "yes"
  assert sorted(p.rsplit("/", 1)[1] for p in plots.plot_results(str(path), str(tmp_path))) == [
      "bleu_vs_length.png"]
