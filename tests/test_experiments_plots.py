"""Tests for relpos.experiments.plots: the PNGs of a table, drawn from results.json alone (the
figures are inspected before they are written: the `figures` fixture)."""

import json

import numpy as np

from relpos.experiments import plots
import fake_results


def test_plots_are_written(results_path, tmp_path):
  paths = plots.plot_results(str(results_path), str(tmp_path))
  assert sorted(p.rsplit("/", 1)[1] for p in paths) == ["bleu_vs_k.png", "bleu_vs_length.png"]
  for p in paths:
    with open(p, "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_bleu_vs_k_titles_and_ticks(results_path, figures):
  plots.plot_results(str(results_path), "out")
  ax, paper_ax = figures["bleu_vs_k.png"].axes
  # The paper's WMT14 BLEU on its own axis: on this one its 12.5-25.9 read as a match for
  # test_long's.
  assert [line.get_label() for line in paper_ax.get_lines()] == ["paper, Table 2 (right axis)"]
  assert paper_ax.get_ylabel() == "paper BLEU (WMT14 EN-DE, newstest2013)"
  assert ax.get_ylabel() == "BLEU here (1 seed, no spread)"
  assert [t.get_text() for t in ax.get_legend().get_texts()
         ] == ["relpos, test", "relpos, test_long", "paper, Table 2 (right axis)"]
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
  # The line breaks between test and test_long (a NaN point): their buckets do not continue.
  np.testing.assert_allclose(bars.lines[0].get_ydata(), [53.0, 49.0, np.nan, 12.0, 10.0])
  np.testing.assert_allclose(bars.lines[0].get_xdata(), [0, 1, 1.5, 2, 3])
  half_widths = [(segment[1][1] - segment[0][1]) / 2
                 for segment in bars.lines[2][0].get_segments()
                 if len(segment) == 2]  # (none at the break)
  np.testing.assert_allclose(half_widths, [2**0.5] * 4)
  assert fig._suptitle.get_text().startswith(  # pylint: disable=protected-access
      "BLEU by source length (mean, bars ± std over seeds); right of the dotted line: test_long, "
      "longer than training\n")
  for ax in panels[2:]:  # the lowest panel of each column (none has no panel below it)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["3-6", "7-12", "13-18", "19-24"]
    assert ax.get_xlabel() == "source length (words)"  # no run counts the sentences


def test_bleu_vs_length_draws_a_row_whose_runs_lack_per_length_scores(results_path, figures):
  """Runs restored from before per-length scores existed: the row's panel says so."""
  results = json.loads(results_path.read_text())
  for run in results["runs"]:
    if run["row"] == "none":
      del run["bleu_by_source_length"]
  results_path.write_text(json.dumps(results))
  assert plots.plot_results(str(results_path), "out")
  panels = [ax for ax in figures["bleu_vs_length.png"].axes if ax.get_visible()]
  assert panels[2].get_title() == "none (no per-length scores)" and not panels[2].containers


def test_bleu_vs_step_one_line_per_row_with_seed_spread(figures):
  runs = [fake_results.run_record("ablation", "abs", seed, 50.0, 10.0) for seed in range(3)]
  runs.append(fake_results.run_record("ablation", "rel_kv", 0, 60.0, 10.0))
  for run, curve in zip(runs, ([[500, 30.0], [1000, 80.0]], [[500, 32.0], [1000, 84.0]],
                               [[500, 34.0], [1000, 82.0]], [[500, 40.0], [1000, 90.0]])):
    run["validation_curve"] = curve
  assert plots.plot_bleu_vs_step(runs, "bleu_vs_step.png") == "bleu_vs_step.png"
  ax = figures["bleu_vs_step.png"].axes[0]
  assert ax.get_title().endswith("synthetic, ablation table, 1-3 seeds per row (0, 1, 2)")
  abs_line, rel_line = ax.get_lines()
  assert (abs_line.get_label(), rel_line.get_label()) == ("abs", "rel_kv")
  assert abs_line.get_marker() == "o"  # 2 points: marked, not read as a curve
  assert ax.get_legend().get_bbox_to_anchor().x0 > ax.get_window_extent().x1  # beside the axes
  np.testing.assert_allclose(abs_line.get_xydata(), [[500, 32.0], [1000, 82.0]])
  band = ax.collections[0].get_paths()[0].vertices  # abs: mean ± std (2) at each step
  for step, low, high in ((500, 30.0, 34.0), (1000, 80.0, 84.0)):
    np.testing.assert_allclose(sorted(set(band[band[:, 0] == step, 1])), [low, high])
  assert plots.plot_bleu_vs_step([fake_results.run_record("ablation", "abs", 0, 50.0, 10.0)],
                                 "x.png") is None


def test_length_plots_show_oracle_beside_beam_search_and_the_ratio(tmp_path, figures):
  path = tmp_path / "results.json"
  path.write_text(json.dumps({"schema_version": 5, "runs": fake_results.length_runs()}))
  plots.plot_results(str(path), "out")
  fig = figures["length_oracle.png"]
  panels = [ax for ax in fig.axes if ax.get_visible()]
  assert [ax.get_title() for ax in panels] == ["abs", "rel_kv", "shape", "rel_kv_concat"]
  beam, oracle = panels[0].containers  # abs, mean over seeds by bucket
  np.testing.assert_allclose(beam.lines[0].get_ydata(), [99.0, 95.0, np.nan, 30.0, 28.0])
  np.testing.assert_allclose(oracle.lines[0].get_ydata(), [99.0, 95.0, np.nan, 64.0, 62.0])
  assert "(1 seed, no spread)" not in fig._suptitle.get_text()  # pylint: disable=protected-access
  ratio = figures["length_ratio.png"].axes[0]
  lines = [c for c in ratio.containers]
  assert [c.get_label() for c in lines] == ["abs", "rel_kv", "shape", "rel_kv_concat"]
  np.testing.assert_allclose(lines[0].lines[0].get_ydata(), [1.0, 1.0, np.nan, 0.9, 0.7])
  # Each bucket over its number of sentences (length_statistics: 10 each).
  for ax in (panels[-1], ratio):
    assert [t.get_text() for t in ax.get_xticklabels()
           ] == ["3-6\n10", "7-12\n10", "13-18\n10", "19-24\n10"]
    # 10 a bucket: each shaded, a mean of too few sentences.
    assert ax.get_xlabel() == ("source length (words) over\nthe number of sentences (shaded: "
                               "under 20)")
    assert len([p for p in ax.patches if p.get_facecolor()[:3] == (0.9, 0.9, 0.9)]) == 4
  test, test_long = figures["token_accuracy.png"].axes
  assert (test.get_title(), test_long.get_title()) == ("test", "test_long")
  abs_line = test_long.get_lines()[0]
  assert abs_line.get_label() == "abs"
  # Positions 0-11 (12-15 have 9 targets, fewer than report_length.MIN_TOKENS_PER_POSITION: not
  # drawn).
  np.testing.assert_allclose(abs_line.get_xdata(), range(12))
  np.testing.assert_allclose(abs_line.get_ydata(), [100.0] * 8 + [50.0] * 4)
  assert test_long.get_lines()[-1].get_xdata()[0] == 15.5  # after the last test position
  entropy = [ax for ax in figures["attention_entropy.png"].axes if ax.get_visible()][0]
  assert entropy.get_title() == "abs"
  assert figures["attention_entropy.png"]._suptitle.get_text().endswith(  # pylint: disable=protected-access
      "each row's lowest seed\nsynthetic, length table, 1 seed per row (0)")
  # Per split and layer; position 2 (5 sentences, fewer than 10) is not drawn.
  assert [(line.get_label(), list(line.get_ydata())) for line in entropy.get_lines()
         ] == [("layer 0, test", [1.0, 2.0]), ("layer 1, test", [0.5, 1.5]),
               ("layer 0, test_long", [2.0, 3.0]), ("layer 1, test_long", [0.5, 2.5])]


def test_length_plots_leave_the_length_alone_split_off_their_length_axis(tmp_path, figures):
  """test_long_seen's lengths are test_long's: its buckets would repeat them after test_long's
  and move the dotted line; its BLEU is in table.md."""
  runs = fake_results.length_runs()
  for run in runs:
    run["scores"]["test_long_seen"] = {"bleu": 60.0}
    run["bleu_by_source_length"]["test_long_seen"] = {"13-15": 61.0, "16-20": 59.0}
    run["oracle_length"]["test_long_seen"] = {"bleu": 62.0, "bleu_by_source_length": {}}
  path = tmp_path / "results.json"
  path.write_text(json.dumps({"schema_version": 5, "runs": runs}))
  plots.plot_results(str(path), "out")
  abs_panel = [ax for ax in figures["length_oracle.png"].axes if ax.get_visible()][0]
  np.testing.assert_allclose(abs_panel.containers[0].lines[0].get_xdata(), [0, 1, 1.5, 2, 3])
  [boundary] = [line for line in abs_panel.get_lines() if line.get_linestyle() == ":"]
  assert list(boundary.get_xdata()) == [1.5, 1.5]  # between test's 7-12 and test_long's 13-18
