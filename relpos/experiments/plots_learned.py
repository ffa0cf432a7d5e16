"""Plots of what the position parameters learned, from a table's results.json alone.

Each run's result.json holds `relpos.attention_statistics.position_statistics` of its model
(mean attention weight by offset, a^K's logits by offset, T5's bias); `plot_learned_positions`
draws attention_by_offset.png, qak_by_offset.png and t5_bias.png from them.
"""

import os
from collections.abc import Sequence

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

from relpos import positions as positions_lib
from relpos.experiments import plots
from relpos.experiments import report


def _first_with(runs: list[dict], key: str) -> dict[str, dict]:
  """Row -> the run of lowest seed whose position statistics have `key`, ablation rows first."""
  found: dict[str, dict] = {}
  for run in sorted(runs, key=lambda r: (r["table"] != "ablation", r["seed"])):
    if key in run.get("position_statistics", {}) and run["row"] not in found:
      found[run["row"]] = run
  return found


def reach(runs: Sequence[dict]) -> tuple[int, str]:
  """The longest distance |j - i| that occurs in the runs' analysed sentences, and where it
  comes from; for results that lack it, the longest a training sequence can hold.

  Returns:
    (distance, "the longest analysed sentence" | "task.max_length - 1").
  """
  stats = [run["position_statistics"] for run in runs]
  if all("longest_distance" in s for s in stats):
    return max(s["longest_distance"] for s in stats), "the longest analysed sentence"
  return (max(run["config"]["task"]["max_length"] for run in runs) - 1, "task.max_length - 1")


def _attention_curve(run: dict, layer: int) -> tuple[list[int], list[float]]:
  """(offsets, mean attention weights) of an encoder layer where some pair exists."""
  stats = run["position_statistics"]
  points = [
      (x, y) for x, y in zip(stats["offsets"], stats["attention_by_offset"][layer]) if y is not None
  ]
  return [x for x, _ in points], [y for _, y in points]


def _qak_curve(run: dict, layer: int, distance: int) -> tuple[np.ndarray, np.ndarray]:
  """(offsets d in ±distance, mean q·a^K[clip(d, -k, k)] / sqrt(depth)) of an encoder layer."""
  stats = run["position_statistics"]
  k = stats["max_distance"]
  offsets = np.arange(-distance, distance + 1)
  return offsets, np.asarray(stats["qak_by_offset"][layer])[np.clip(offsets, -k, k) + k]


def _per_layer_figure(by_row: dict[str, dict], key: str, curve, title: str, ylabel: str,
                      path: str) -> str:
  """One subplot per encoder layer, one line per row: curve(run, layer) -> (x, y)."""
  num_layers = max(len(run["position_statistics"][key]) for run in by_row.values())
  fig, axes = plt.subplots(1, num_layers, figsize=(4.5 * num_layers, 3.8), squeeze=False)
  for layer, ax in enumerate(axes[0]):
    for row, run in by_row.items():
      if layer < len(run["position_statistics"][key]):
        ax.plot(*curve(run, layer), marker=".", markersize=3, label=row)
    ax.set_title(f"encoder layer {layer}", fontsize=9)
    ax.set_xlabel("offset j - i (key minus query)")
    ax.set_ylabel(ylabel)
  axes[0][0].legend(fontsize=7, ncol=2)
  fig.suptitle(f"{title}\n{plots.describe(list(by_row.values()))}", fontsize=9)
  return plots.save(fig, path)


def _t5_bias_figure(row: str, run: dict, path: str) -> str:
  """The encoder's T5 bias of each head against the distance j - i it applies to."""
  config = run["config"]["model"]
  bias = np.asarray(run["position_statistics"]["t5_bias"])  # [buckets, heads]
  distance, source = reach([run])
  distances = np.arange(-distance, distance + 1)
  buckets = np.asarray(
      positions_lib.t5_relative_position_bucket(distances, bidirectional=True,
                                                num_buckets=config["t5_num_buckets"],
                                                max_distance=config["t5_max_distance"]))
  fig, ax = plt.subplots(figsize=(6.5, 3.8))
  for head in range(bias.shape[1]):
    ax.plot(distances, bias[buckets, head], drawstyle="steps-mid", label=f"head {head}")
  ax.set_xlabel("distance j - i (key minus query)")
  ax.set_ylabel("bias")
  ax.set_title(
      f"T5 bias of the encoder ({row}) by distance, up to {distance} ({source})\n"
      f"{plots.describe([run])}", fontsize=9)
  ax.legend(fontsize=7)
  return plots.save(fig, path)


def plot_learned_positions(results_path: str, output_dir: str) -> list[str]:
  """attention_by_offset.png, qak_by_offset.png and t5_bias.png, where the runs support them.

  Each draws the lowest seed of each row; a^K logits and T5 biases are drawn for the
  distances that occur (`reach`), not for the whole table.
  """
  runs = report.load_runs(results_path)
  made = []
  attention = _first_with(runs, "attention_by_offset")
  if attention:
    made.append(
        _per_layer_figure(attention, "attention_by_offset", _attention_curve,
                          "Mean attention weight by offset (encoder self-attention)", "weight",
                          os.path.join(output_dir, "attention_by_offset.png")))
  qak = _first_with(runs, "qak_by_offset")
  if qak:
    distance, source = reach(list(qak.values()))
    made.append(
        _per_layer_figure(
            qak, "qak_by_offset", lambda run, layer: _qak_curve(run, layer, distance),
            f"Mean logit q·a^K / sqrt(d) that a^K adds at each offset (clipped at k), up to "
            f"{distance} ({source})", "logit", os.path.join(output_dir, "qak_by_offset.png")))
  t5 = _first_with(runs, "t5_bias")
  if t5:
    row, run = next(iter(t5.items()))
    made.append(_t5_bias_figure(row, run, os.path.join(output_dir, "t5_bias.png")))
  return made
