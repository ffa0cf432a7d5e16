"""Tests for relpos.experiments.report and .plots: table.md and PNGs from results.json alone."""

import json
import os

import numpy as np
import pytest

from relpos.experiments import analysis
from relpos.experiments import plots
from relpos.experiments import report
from relpos.experiments import verdicts


def _run(table, row, seed, test, long, *, k=None, speed=10.0):
  return {
      "table": table,
      "row": row,
      "seed": seed,
      "k": k,
      "task": "synthetic",
      "commit": "abc1234",
      "wall_time_s": 60.0,
      "steps_per_second": speed,
      "num_params": 1000,
      "config": {},
      "scores": {
          "validation": {"bleu": test + 1}, "test": {"bleu": test}, "test_long": {"bleu": long}
      },
      "bleu_by_source_length": {
          "test": {"3-6": test + 2, "7-12": test - 2},
          "test_long": {"13-18": long + 1, "19-24": long - 1}
      },
  }


def _few_seeds():
  """Two seeds of abs and rel_kv, one of none, rel_k, rel_v and of k = 0, 1, 2 and 4."""
  return [
      _run("ablation", "abs", 0, 50.0, 10.0, speed=10.0),
      _run("ablation", "abs", 1, 52.0, 12.0, speed=10.0),
      _run("ablation", "rel_kv", 0, 60.0, 40.0, speed=9.6),
      _run("ablation", "rel_kv", 1, 62.0, 42.0, speed=9.6),
      _run("ablation", "none", 0, 20.0, 5.0),
      _run("ablation", "rel_k", 0, 61.0, 41.0),
      _run("ablation", "rel_v", 0, 30.0, 20.0),
  ] + [_run("k_sweep", f"k={k}", 0, 20.0 if k == 0 else 60.0, 30.0, k=k) for k in (0, 1, 2, 4)]


@pytest.fixture
def results_path(tmp_path):
  path = tmp_path / "results.json"
  path.write_text(json.dumps({"runs": _few_seeds()}))
  return path


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
      **_run("ablation", "abs", seed, 50.0, 10.0), "wall_time_s": total,
      "time_s": {"training": total - 30.0, "validation": 10.0, "evaluation": 20.0}
  } for seed, total in ((0, 100.0), (1, 140.0))]
  path = tmp_path / "results.json"
  path.write_text(json.dumps({"schema_version": 3, "runs": runs}))
  text = report.write_table(str(path), str(tmp_path / "table.md"))
  assert ("Time per run (mean of 2): 120 s = training 90 s (steps, compilation, checkpoints) + "
          "validation during training 10 s + final evaluation 20 s (every split, position "
          "statistics, length diagnostics).") in text


def test_plots_are_written(results_path, tmp_path):
  paths = plots.plot_results(str(results_path), str(tmp_path))
  assert sorted(p.rsplit("/", 1)[1] for p in paths) == ["bleu_vs_k.png", "bleu_vs_length.png"]
  for p in paths:
    with open(p, "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def figures(monkeypatch):
  """Figure name -> the matplotlib figure a plot function made (not written)."""
  made = {}

  def keep(fig, path):
    made[os.path.basename(path)] = fig
    return path

  monkeypatch.setattr(plots, "save", keep)
  return made


def test_bleu_vs_k_titles_and_ticks(results_path, figures):
  plots.plot_results(str(results_path), "out")
  ax = figures["bleu_vs_k.png"].axes[0]
  assert ax.get_title().endswith("synthetic, k_sweep table, 1 seed per row (0)")
  # Every k of the grid, though the runs hold 0-4 only; no minor ticks between them.
  assert list(ax.get_xticks()) == [0, 1, 2, 4, 16, 64, 256]
  assert not ax.xaxis.get_minorticklocs().size


def test_bleu_vs_length_has_a_panel_per_row_with_error_bars(results_path, figures):
  plots.plot_results(str(results_path), "out")
  fig = figures["bleu_vs_length.png"]
  assert fig._suptitle.get_text().endswith(  # pylint: disable=protected-access
      "synthetic, ablation table, 1-2 seeds per row (0, 1); other rows in grey")
  panels = [ax for ax in fig.axes if ax.get_visible()]
  assert [ax.get_title() for ax in panels] == ["abs", "rel_kv", "none", "rel_k", "rel_v"]
  bars = panels[0].containers[0]  # abs: test 50 and 52, test_long 10 and 12
  np.testing.assert_allclose(bars.lines[0].get_ydata(), [53.0, 49.0, 12.0, 10.0])
  half_widths = [(segment[1][1] - segment[0][1]) / 2 for segment in bars.lines[2][0].get_segments()]
  np.testing.assert_allclose(half_widths, [2**0.5] * 4)
  for ax in panels[2:]:  # the lowest panel of each column (none has no panel below it)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["3-6", "7-12", "13-18", "19-24"]


def test_single_length_buckets_are_labelled_by_their_length():
  assert report.bucket_label("12-12") == report.bucket_label("12") == "12"
  assert report.bucket_label("3-5") == "3-5"
  runs = [_run("ablation", "abs", 0, 50.0, 10.0)]
  runs[0]["bleu_by_source_length"]["test"] = {"3-11": 60.0, "12-12": 40.0}
  assert "| row | 3-11 | 12 |" in report.render_table(runs)


def test_bleu_vs_step_one_line_per_row_with_seed_spread(figures):
  runs = [_run("ablation", "abs", seed, 50.0, 10.0) for seed in range(3)]
  runs.append(_run("ablation", "rel_kv", 0, 60.0, 10.0))
  for run, curve in zip(runs, ([[500, 30.0], [1000, 80.0]], [[500, 32.0], [1000, 84.0]],
                               [[500, 34.0], [1000, 82.0]], [[500, 40.0], [1000, 90.0]])):
    run["validation_curve"] = curve
  assert plots.plot_bleu_vs_step(runs, "bleu_vs_step.png") == "bleu_vs_step.png"
  ax = figures["bleu_vs_step.png"].axes[0]
  assert ax.get_title().endswith("synthetic, ablation table, 1-3 seeds per row (0, 1, 2)")
  abs_line, rel_line = ax.get_lines()
  assert (abs_line.get_label(), rel_line.get_label()) == ("abs", "rel_kv")
  np.testing.assert_allclose(abs_line.get_xydata(), [[500, 32.0], [1000, 82.0]])
  band = ax.collections[0].get_paths()[0].vertices  # abs: mean ± std (2) at each step
  for step, low, high in ((500, 30.0, 34.0), (1000, 80.0, 84.0)):
    np.testing.assert_allclose(sorted(set(band[band[:, 0] == step, 1])), [low, high])
  assert plots.plot_bleu_vs_step([_run("ablation", "abs", 0, 50.0, 10.0)], "x.png") is None


def _learned_run(row, statistics, *, max_length=6):
  run = _run("ablation", row, 0, 50.0, 10.0)
  run["config"] = {
      "task": {"max_length": max_length}, "model": {"t5_num_buckets": 8, "t5_max_distance": 12}
  }
  run["position_statistics"] = {
      "offsets": [-1, 0, 1], "attention_by_offset": [[0.2, 0.6, 0.2]], **statistics
  }
  return run


def test_qak_drawn_over_the_distances_that_occur(tmp_path, figures):
  qak = {"qak_by_offset": [[-2.0, -1.0, 0.0, 1.0, 2.0]], "max_distance": 2}
  results = tmp_path / "results.json"
  results.write_text(json.dumps({"runs": [_learned_run("rel_kv", qak)]}))
  analysis.plot_learned_positions(str(results), str(tmp_path))
  ax = figures["qak_by_offset.png"].axes[0]
  # Older results: up to task.max_length - 1 = 5, clipped at k = 2 beyond it.
  np.testing.assert_allclose(ax.get_lines()[0].get_xydata(),
                             [[d, min(max(d, -2), 2)] for d in range(-5, 6)])
  assert "up to 5 (task.max_length - 1)" in figures["qak_by_offset.png"]._suptitle.get_text()
  results.write_text(json.dumps({"runs": [_learned_run("rel_kv", {**qak, "longest_distance": 3})]}))
  analysis.plot_learned_positions(str(results), str(tmp_path))
  np.testing.assert_array_equal(figures["qak_by_offset.png"].axes[0].get_lines()[0].get_xdata(),
                                range(-3, 4))


def test_t5_bias_drawn_against_distance(tmp_path, figures):
  bias = np.arange(16.0).reshape(8, 2)  # [buckets, heads]
  run = _learned_run("t5", {"t5_bias": bias.tolist(), "longest_distance": 2})
  results = tmp_path / "results.json"
  results.write_text(json.dumps({"runs": [run]}))
  analysis.plot_learned_positions(str(results), str(tmp_path))
  ax = figures["t5_bias.png"].axes[0]
  # 8 bidirectional buckets: 4 a direction, 2 exact; distances -2..2 fall in 2, 1, 0, 5, 6.
  for head, line in enumerate(ax.get_lines()):
    np.testing.assert_array_equal(line.get_xdata(), range(-2, 3))
    np.testing.assert_array_equal(line.get_ydata(), bias[[2, 1, 0, 5, 6], head])
  assert ax.get_xlabel() == "distance j - i (key minus query)"


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


def _length_run(row, seed, test, long, oracle, *, ratio=0.8, shorter=0.6):
  """A length-table run with the schema-5 diagnostics: test_long at `long`, `oracle` at the
  references' lengths, length ratio `ratio` on test_long (1.0 on test)."""
  run = _run("length", row, seed, test, long)
  run["oracle_length"] = {
      "test": {"bleu": test, "bleu_by_source_length": {"3-6": test + 2, "7-12": test - 2}},
      "test_long": {
          "bleu": oracle, "bleu_by_source_length": {"13-18": oracle + 1, "19-24": oracle - 1}
      }
  }
  stats = lambda r, s: {"ratio": r, "shorter": s, "longer": 0.1, "num_sentences": 10}
  run["length_statistics"] = {
      "test": {
          "unit": "tokens",
          **stats(1.0, 0.0), "by_source_length": {"3-6": stats(1.0, 0.0), "7-12": stats(1.0, 0.0)}
      }, "test_long": {
          "unit": "tokens", **stats(ratio, shorter), "by_source_length": {
              "13-18": stats(ratio + 0.1, shorter), "19-24": stats(ratio - 0.1, shorter)
          }
      }
  }
  run["token_accuracy_by_position"] = {
      split: {
          "accuracy": [1.0] * 8 + [0.5] * 4 + [0.0] * 4 + [None] * 4,
          "count": [40] * 8 + [20] * 4 + [9] * 4 + [0] * 4, "eos_accuracy": 0.25,
          "accuracy_all": 0.5
      } for split in ("test", "test_long")
  }
  run["attention_profile"] = {
      split: {
          "normalized_entropy": normalized, "count_by_query": [20, 20, 5],
          "entropy_by_query": [[1.0 + shift, 2.0 + shift, 3.0], [0.5, 1.5 + shift, None]]
      } for split, normalized, shift in (("test", [0.5, 0.7], 0.0), ("test_long", [0.4, 0.6], 1.0))
  }
  return run


def _length_runs():
  """Three seeds of abs, rel_kv, shape (over abs) and rel_kv_concat (over rel_kv)."""
  runs = []
  for seed in range(3):
    runs += [
        _length_run("abs", seed, 96.0 + seed, 28.0 + seed, 62.0 + seed),
        _length_run("rel_kv", seed, 97.0 + seed, 25.0 + 2 * seed, 25.5 + 2 * seed),
        _length_run("shape", seed, 90.0 + seed, 40.0 + seed, 70.0 + seed),
        _length_run("rel_kv_concat", seed, 97.0 + seed, 26.0 + 2 * seed, 60.0)
    ]
  return runs


def test_length_table_columns_and_diagnostics():
  text = report.render_table(_length_runs())
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


def test_length_plots_show_oracle_beside_beam_search_and_the_ratio(tmp_path, figures):
  path = tmp_path / "results.json"
  path.write_text(json.dumps({"schema_version": 5, "runs": _length_runs()}))
  plots.plot_results(str(path), "out")
  fig = figures["length_oracle.png"]
  panels = [ax for ax in fig.axes if ax.get_visible()]
  assert [ax.get_title() for ax in panels] == ["abs", "rel_kv", "shape", "rel_kv_concat"]
  beam, oracle = panels[0].containers  # abs, mean over seeds by bucket
  np.testing.assert_allclose(beam.lines[0].get_ydata(), [99.0, 95.0, 30.0, 28.0])
  np.testing.assert_allclose(oracle.lines[0].get_ydata(), [99.0, 95.0, 64.0, 62.0])
  ratio = figures["length_ratio.png"].axes[0]
  lines = [c for c in ratio.containers]
  assert [c.get_label() for c in lines] == ["abs", "rel_kv", "shape", "rel_kv_concat"]
  np.testing.assert_allclose(lines[0].lines[0].get_ydata(), [1.0, 1.0, 0.9, 0.7])
  test, test_long = figures["token_accuracy.png"].axes
  assert (test.get_title(), test_long.get_title()) == ("test", "test_long")
  abs_line = test_long.get_lines()[0]
  assert abs_line.get_label() == "abs"
  # Positions 0-11 (12-15 have 9 targets, fewer than MIN_TOKENS_PER_POSITION: not drawn).
  np.testing.assert_allclose(abs_line.get_xdata(), range(12))
  np.testing.assert_allclose(abs_line.get_ydata(), [100.0] * 8 + [50.0] * 4)
  assert test_long.get_lines()[-1].get_xdata()[0] == 15.5  # after the last test position
  entropy = [ax for ax in figures["attention_entropy.png"].axes if ax.get_visible()][0]
  assert entropy.get_title() == "abs"
  # Per split and layer; position 2 (5 sentences, fewer than 10) is not drawn.
  assert [(line.get_label(), list(line.get_ydata())) for line in entropy.get_lines()
         ] == [("layer 0, test", [1.0, 2.0]), ("layer 1, test", [0.5, 1.5]),
               ("layer 0, test_long", [2.0, 3.0]), ("layer 1, test_long", [0.5, 2.5])]
