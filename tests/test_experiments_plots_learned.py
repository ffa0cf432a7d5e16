"""Tests for relpos.experiments.plots_learned: plots of what the position parameters learned,
drawn from a results.json."""

import json

import numpy as np

import fake_results
from relpos.experiments import plots_learned


def _learned_run(row, statistics, *, max_length=6):
  run = fake_results.run_record("ablation", row, 0, 50.0, 10.0)
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
  plots_learned.plot_learned_positions(str(results), str(tmp_path))
  ax = figures["qak_by_offset.png"].axes[0]
  # Older results: up to task.max_length - 1 = 5, clipped at k = 2 beyond it.
  np.testing.assert_allclose(ax.get_lines()[0].get_xydata(),
                             [[d, min(max(d, -2), 2)] for d in range(-5, 6)])
  assert "up to 5 (task.max_length - 1)" in figures["qak_by_offset.png"]._suptitle.get_text()
  results.write_text(json.dumps({"runs": [_learned_run("rel_kv", {**qak, "longest_distance": 3})]}))
  plots_learned.plot_learned_positions(str(results), str(tmp_path))
  np.testing.assert_array_equal(figures["qak_by_offset.png"].axes[0].get_lines()[0].get_xdata(),
                                range(-3, 4))


def test_t5_bias_drawn_against_distance(tmp_path, figures):
  bias = np.arange(16.0).reshape(8, 2)  # [buckets, heads]
  run = _learned_run("t5", {"t5_bias": bias.tolist(), "longest_distance": 2})
  results = tmp_path / "results.json"
  results.write_text(json.dumps({"runs": [run]}))
  plots_learned.plot_learned_positions(str(results), str(tmp_path))
  ax = figures["t5_bias.png"].axes[0]
  # 8 bidirectional buckets: 4 a direction, 2 exact; distances -2..2 fall in 2, 1, 0, 5, 6.
  for head, line in enumerate(ax.get_lines()):
    np.testing.assert_array_equal(line.get_xdata(), range(-2, 3))
    np.testing.assert_array_equal(line.get_ydata(), bias[[2, 1, 0, 5, 6], head])
  assert ax.get_xlabel() == "distance j - i (key minus query)"
