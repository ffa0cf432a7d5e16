"""PNG plots made from `results.json`: BLEU against k, source length and training step, and
for the length table BLEU by source length beside oracle-length BLEU and the length ratio.

Every title names the task, the table and the seeds its points average over.
"""

import collections
import os

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
from matplotlib import ticker  # pylint: disable=g-import-not-at-top

from relpos.experiments import paper
from relpos.experiments import report
from relpos.experiments import report_length
from relpos.experiments import tables
from relpos.experiments import significance
from relpos.experiments import verdicts

# A length bucket with fewer sentences than this is shaded on a plot's length axis: its mean is
# mostly noise (Multi30K's test has 2 sentences of 28-32 words).
MIN_SENTENCES_PER_BUCKET = 20


def _seeds_per_row(runs: list[dict]) -> tuple[int, int]:
  """(fewest, most) runs of one (table, row) among `runs`."""
  per_row = collections.Counter((r["table"], r["row"]) for r in runs).values()
  return min(per_row), max(per_row)


def spread(runs: list[dict], marks: str = "bars") -> str:
  """What a plot's points and `marks` (bars, band) show: "mean, bars ± std over seeds", or
  "1 seed, no spread" when no row has more."""
  return ("1 seed, no spread"
          if _seeds_per_row(runs)[1] == 1 else f"mean, {marks} ± std over seeds")


def describe(runs: list[dict]) -> str:
  """"<task>, <table> table(s), <n> seeds per row (<seeds>)" for a plot's title."""
  tasks = sorted({r["task"] for r in runs})
  tables = list(dict.fromkeys(r["table"] for r in runs))
  low, high = _seeds_per_row(runs)
  count = f"{low}" if low == high else f"{low}-{high}"
  seeds = ", ".join(str(s) for s in sorted({r["seed"] for r in runs}))
  return (f"{', '.join(tasks)}, {' + '.join(tables)} table{'s' if len(tables) > 1 else ''}, "
          f"{count} seed{'s' if high > 1 else ''} per row ({seeds})")


def save(fig, path: str) -> str:
  """Writes `fig` to `path` (PNG) and closes it."""
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


def plot_bleu_vs_k(runs: list[dict], path: str) -> str | None:
  """BLEU (mean ± std over seeds) against the clipping distance k, beside the paper.

  Returns:
    The path written, or None when the runs hold no k sweep.
  """
  sweep = [r for r in runs if r["table"] == "k_sweep"]
  ks = sorted({r["k"] for r in sweep})
  if not ks:
    return None
  fig, ax = plt.subplots(figsize=(6, 4))
  held_out = [s for s in verdicts.splits_in_order(sweep) if s != "validation"]
  for split, style in zip(held_out, ("o-", "s--", "^-.")):
    points = [(k,
               [r["scores"][split]["bleu"]
                for r in sweep
                if r["k"] == k and split in r["scores"]])
              for k in ks]
    points = [(k, v) for k, v in points if v]
    if points:
      stats = [significance.mean_std(v) for _, v in points]
      ax.errorbar([k for k, _ in points], [m for m, _ in stats], yerr=[s for _, s in stats],
                  fmt=style, capsize=3, label=f"relpos, {split}")
  # The paper's BLEU on an axis of its own: its direction, not its size, compares.
  paper_ax = ax.twinx()
  paper_ax.plot(list(paper.K_SWEEP_FIGURES), list(paper.K_SWEEP_FIGURES.values()), "k:", marker="x",
                label="paper, Table 2 (right axis)")
  paper_ax.set_ylabel("paper BLEU (WMT14 EN-DE, newstest2013)", fontsize=8)
  ax.set_xscale("symlog", linthresh=1)
  grid = sorted(set(tables.K_GRID) | set(ks))
  ax.set_xticks(grid)
  ax.set_xticklabels([str(k) for k in grid])
  ax.xaxis.set_minor_locator(ticker.NullLocator())
  ax.set_xlabel("clipping distance k")
  ax.set_ylabel(f"BLEU here ({spread(sweep)})")
  ax.set_title(f"BLEU against k\n{describe(sweep)}", fontsize=9)
  handles = ax.get_legend_handles_labels()
  paper_handles = paper_ax.get_legend_handles_labels()
  ax.legend(handles[0] + paper_handles[0], handles[1] + paper_handles[1], fontsize=8,
            loc="lower right")
  return save(fig, path)


def _panels(count: int, *, width: float, height: float):
  """A grid of `count` panels sharing both axes (at most 3 a line); the unused ones hidden.

  Returns:
    (figure, list of `count` axes).
  """
  columns = min(3, count)
  lines = -(-count // columns)
  fig, axes = plt.subplots(lines, columns, figsize=(max(width * columns, 7.5), height * lines),
                           sharex=True, sharey=True, squeeze=False)
  for ax in axes.flat[count:]:
    ax.set_visible(False)
  return fig, list(axes.flat[:count])


def _label_panels(axes: list, xlabel: str, ylabel: str) -> None:
  """Labels a `_panels` grid: x ticks and label under the lowest panel of each column, the
  y label beside the first panel of each line."""
  for ax in axes[-min(3, len(axes)):]:
    ax.xaxis.set_tick_params(labelbottom=True)
    ax.set_xlabel(xlabel, fontsize=8)
  for ax in axes[::3]:
    ax.set_ylabel(ylabel, fontsize=8)


def _length_axis_splits(runs: list[dict]) -> list[str]:
  """The held-out splits whose length buckets make a plot's x axis, in order: not validation,
  and not the length-alone split (its lengths are test_long's, its BLEU is in table.md)."""
  return [
      s for s in verdicts.splits_in_order(runs)
      if s not in ("validation", verdicts.LENGTH_ALONE_SPLIT)
  ]


def plot_bleu_vs_length(runs: list[dict], path: str) -> str | None:
  """BLEU (mean ± std over seeds) against source length bucket (test splits in order), one
  panel per ablation row, the other rows in grey behind it.

  Returns:
    The path written, or None when the runs hold no per-length scores.
  """
  ablation_runs = [r for r in runs if r["table"] == "ablation"]
  held_out = _length_axis_splits(ablation_runs)
  buckets = [(s, b) for s in held_out for b in report_length.length_buckets(ablation_runs, s)]
  if not buckets:
    return None
  rows = verdicts.rows_in_order(ablation_runs, "ablation")
  curves = {  # row -> (x, means, stds); empty for a row whose runs lack per-length scores
      row: _bucket_points(verdicts.runs_of_row(ablation_runs, "ablation", row), buckets,
                          report_length.bleu_at_length) for row in rows
  }
  fig, axes = _panels(len(rows), width=3.6, height=2.8)
  for ax, row in zip(axes, rows):
    for other in rows:
      if other != row:
        ax.plot(*curves[other][:2], color="0.85", linewidth=1)
    if len(curves[row][0]):
      ax.errorbar(*curves[row], fmt="o-", color="C0", capsize=3, markersize=4)
    ax.set_title(row if len(curves[row][0]) else f"{row} (no per-length scores)", fontsize=9)
    _bucket_axis(ax, buckets, ablation_runs)
  _label_panels(axes, _bucket_axis_label(buckets, ablation_runs), "BLEU")
  longer = f"; {_longer_note(ablation_runs)}" if "test_long" in held_out else ""
  others = "; other rows in grey" if len(rows) > 1 else ""
  fig.suptitle(
      f"BLEU by source length ({spread(ablation_runs)}){longer}\n"
      f"{describe(ablation_runs)}{others}", fontsize=9)
  return save(fig, path)


def plot_bleu_vs_step(runs: list[dict], path: str) -> str | None:
  """Validation BLEU against training step, one line per row (mean over seeds, band ± std).

  Returns:
    The path written, or None when no run holds a validation curve.
  """
  curved = [r for r in runs if r.get("validation_curve")]
  if not curved:
    return None
  fig, ax = plt.subplots(figsize=(8, 4.2))
  rows = list(dict.fromkeys((r["table"], r["row"]) for r in curved))
  for index, (table, row) in enumerate(rows):
    by_step = collections.defaultdict(list)
    for run in curved:
      if (run["table"], run["row"]) == (table, row):
        for step, bleu in run["validation_curve"]:
          by_step[step].append(bleu)
    steps = sorted(by_step)
    means, stds = (
        np.array(column) for column in zip(*(significance.mean_std(by_step[s]) for s in steps)))
    color = f"C{index % 10}"
    ax.plot(steps, means, marker="o" if len(steps) <= 3 else ".", color=color, label=row)
    ax.fill_between(steps, means - stds, means + stds, color=color, alpha=0.15, linewidth=0)
  ax.set_xlabel("training step")
  ax.set_ylabel("validation BLEU")
  ax.set_title(
      f"Validation BLEU during training ({spread(curved, 'band')})\n"
      f"{describe(curved)}", fontsize=9)
  ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside, not over a line
  return save(fig, path)


def _bucket_points(runs: list[dict], buckets: list[tuple[str, str]],
                   value) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(x, means, stds) over seeds of value(run, split, bucket) (None: missing) per bucket, with a
  NaN point between two splits, where a line breaks (test_long's first bucket is not test's
  next)."""
  points = []
  for x, (split, bucket) in enumerate(buckets):
    if x and split != buckets[x - 1][0]:
      points.append((x - 0.5, np.nan, np.nan))
    values = [v for v in (value(r, split, bucket) for r in runs) if v is not None]
    if values:
      points.append((x, *significance.mean_std(values)))
  if all(np.isnan(mean) for _, mean, _ in points):  # no value at all: nothing to draw
    return ((), (), ())
  return tuple(np.array(column) for column in zip(*points))


def _length_ratio(run: dict, split: str, bucket: str) -> float | None:
  stats = report_length.length_statistics_at_length(run, split, bucket)
  return stats["ratio"] if stats else None


def _length_runs(runs: list[dict]) -> tuple[list[dict], list[tuple[str, str]], list[str]]:
  """(the length table's runs with diagnostics, their (split, bucket) points in order, rows)."""
  table = [r for r in runs if r["table"] == "length" and "oracle_length" in r]
  held_out = _length_axis_splits(table)
  buckets = [(s, b) for s in held_out for b in report_length.length_buckets(table, s)]
  return table, buckets, verdicts.rows_in_order(table, "length")


def _bucket_axis(ax, buckets: list[tuple[str, str]], runs: list[dict]) -> None:
  """Bucket labels on the x axis, each above its number of sentences where `runs` count them,
  the buckets of fewer than MIN_SENTENCES_PER_BUCKET shaded (a mean over a few sentences is
  noise), and a dotted line where the longer-than-training split begins."""
  if any(s == "test_long" for s, _ in buckets):
    ax.axvline(sum(1 for s, _ in buckets if s != "test_long") - 0.5, color="grey", linestyle=":")
  labels = []
  for x, (split, bucket) in enumerate(buckets):
    count = report_length.sentences_at_length(runs, split, bucket)
    labels.append(report_length.bucket_label(bucket) + ("" if count is None else f"\n{count}"))
    if count is not None and count < MIN_SENTENCES_PER_BUCKET:
      ax.axvspan(x - 0.5, x + 0.5, color="0.9", zorder=0, linewidth=0)
  ax.set_xticks(range(len(buckets)))
  ax.set_xticklabels(labels, fontsize=7)


def _bucket_axis_label(buckets: list[tuple[str, str]], runs: list[dict]) -> str:
  """The x axis's label under `_bucket_axis`'s ticks."""
  counts = [report_length.sentences_at_length(runs, s, b) for s, b in buckets]
  sparse = any(c is not None and c < MIN_SENTENCES_PER_BUCKET for c in counts)
  return "source length (words)" + (" over\nthe number of sentences" if any(
      c is not None
      for c in counts) else "") + (f" (shaded: under {MIN_SENTENCES_PER_BUCKET})" if sparse else "")


def _longer_note(runs: list[dict]) -> str:
  """ "right of the dotted line: test_long, longer than training", and where a run records
  test_long's subsets (the synthetic task), how many of its sentences hold a construction
  never seen in training."""
  note = "right of the dotted line: test_long, longer than training"
  for run in runs:
    subsets = run["scores"].get("test_long", {}).get("bleu_by_subset")
    if subsets and "seen constructions" in subsets:
      total = sum(s["num_sentences"] for s in subsets.values())
      unseen = total - subsets["seen constructions"]["num_sentences"]
      return f"{note} ({unseen} of {total} with constructions unseen in training)"
  return note


def plot_length_oracle(runs: list[dict], path: str) -> str | None:
  """The length table: BLEU by source length (solid) beside BLEU at the references' lengths
  (oracle length, dashed), mean ± std over seeds, one panel per row.

  Returns:
    The path written, or None when no length-table run has oracle-length scores.
  """
  table, buckets, rows = _length_runs(runs)
  if not buckets:
    return None
  fig, axes = _panels(len(rows), width=3.6, height=2.8)
  for ax, row in zip(axes, rows):
    row_runs = [r for r in table if r["row"] == row]
    ax.errorbar(*_bucket_points(row_runs, buckets, report_length.bleu_at_length), fmt="o-",
                color="C0", capsize=3, markersize=4, label="beam search")
    ax.errorbar(*_bucket_points(row_runs, buckets, report_length.oracle_bleu_at_length), fmt="s--",
                color="C3", capsize=3, markersize=4, label="oracle length")
    ax.set_title(row, fontsize=9)
    _bucket_axis(ax, buckets, table)
  axes[0].legend(fontsize=7)
  _label_panels(axes, _bucket_axis_label(buckets, table), "BLEU")
  fig.suptitle(
      "BLEU by source length, and with eos forced at the reference's length (oracle "
      f"length), {spread(table)}\n{_longer_note(table)}; {describe(table)}", fontsize=9)
  return save(fig, path)


def plot_length_ratio(runs: list[dict], path: str) -> str | None:
  """The length table: hypothesis/reference length ratio (target tokens) by source length,
  one line per row (mean over seeds, bars ± std).

  Returns:
    The path written, or None when no length-table run has length statistics.
  """
  table, buckets, rows = _length_runs(runs)
  if not buckets:
    return None
  fig, ax = plt.subplots(figsize=(7.5, 4.2))
  for index, row in enumerate(rows):
    x, means, stds = _bucket_points([r for r in table if r["row"] == row], buckets, _length_ratio)
    ax.errorbar(
        np.asarray(x) + 0.03 * (index - len(rows) / 2), means, yerr=stds, fmt=".-", capsize=2,
        color=f"C{index % 10}", label=row)
  ax.axhline(1.0, color="black", linewidth=0.8)
  _bucket_axis(ax, buckets, table)
  ax.set_xlabel(_bucket_axis_label(buckets, table))
  ax.set_ylabel("hypothesis / reference length")
  ax.set_title(
      f"Hypothesis / reference length in target tokens (below 1: too short), {spread(table)}"
      f"\n{_longer_note(table)}\n{describe(table)}", fontsize=9)
  ax.legend(fontsize=7, ncol=3)
  return save(fig, path)


def _mean_curve(curves: list[list[float | None]]) -> tuple[np.ndarray, np.ndarray]:
  """(positions, mean over curves) where at least one curve has a value (None: no value)."""
  points = []
  for position in range(max(len(c) for c in curves)):
    values = [c[position] for c in curves if position < len(c) and c[position] is not None]
    if values:
      points.append((position, sum(values) / len(values)))
  return np.array([p for p, _ in points]), np.array([v for _, v in points])


def plot_token_accuracy(runs: list[dict], path: str) -> str | None:
  """The length table: teacher-forced token accuracy by target position, one panel per test
  split, one line per row (mean over seeds; positions with at least
  report_length.MIN_TOKENS_PER_POSITION targets); a dotted line after the last position `test`
  targets reach.

  Returns:
    The path written, or None when no length-table run has token accuracies.
  """
  table = [r for r in runs if r["table"] == "length" and "token_accuracy_by_position" in r]
  if not table:
    return None
  splits = [
      s for s in verdicts.splits_in_order(table) if s in table[0]["token_accuracy_by_position"]
  ]
  rows = verdicts.rows_in_order(table, "length")
  fig, axes = plt.subplots(1, len(splits), figsize=(5.5 * len(splits), 4), sharey=True,
                           squeeze=False)
  short = [r["token_accuracy_by_position"].get("test", {}).get("count", []) for r in table]
  reach = max((i for counts in short for i, c in enumerate(counts) if c), default=None)
  for ax, split in zip(axes[0], splits):
    for index, row in enumerate(rows):
      stats = [r["token_accuracy_by_position"][split] for r in table if r["row"] == row]
      curves = [[
          100 * a if c >= report_length.MIN_TOKENS_PER_POSITION else None
          for a, c in zip(s["accuracy"], s["count"])
      ]
                for s in stats]
      ax.plot(*_mean_curve(curves), ".-", markersize=3, color=f"C{index % 10}", label=row)
    if reach is not None and split != "test":
      ax.axvline(reach + 0.5, color="grey", linestyle=":")
    ax.set_title(split, fontsize=9)
    ax.set_xlabel("target position (tokens, from 0)")
  axes[0][0].set_ylabel("token accuracy (%), teacher-forced")
  axes[0][0].legend(fontsize=7, ncol=2)
  fig.suptitle(
      "Teacher-forced next-token accuracy by target position (positions that at "
      f"least {report_length.MIN_TOKENS_PER_POSITION} targets reach; right of the dotted line: "
      f"longer than any test target)\n{describe(table)}", fontsize=9)
  return save(fig, path)


def plot_attention_entropy(runs: list[dict], path: str) -> str | None:
  """The length table: the encoder's self-attention entropy by query position on test
  sources (solid) and test_long sources (dashed), one panel per row (lowest seed), one colour
  per layer.

  Returns:
    The path written, or None when no length-table run has attention profiles.
  """
  table = [r for r in runs if r["table"] == "length" and "attention_profile" in r]
  if not table:
    return None
  rows = verdicts.rows_in_order(table, "length")
  fig, axes = _panels(len(rows), width=3.6, height=2.8)
  drawn = [min(verdicts.runs_of_row(table, "length", row), key=lambda r: r["seed"]) for row in rows]
  for ax, row, run in zip(axes, rows, drawn):
    for split, profile in run["attention_profile"].items():
      style = {"test": "-", "test_long": "--"}.get(split, ":")
      for layer, entropy in enumerate(profile["entropy_by_query"]):
        counts = profile["count_by_query"]
        ax.plot(
            *_mean_curve([[
                e if c >= report_length.MIN_TOKENS_PER_POSITION else None
                for e, c in zip(entropy, counts)
            ]]), style, color=f"C{layer % 10}", label=f"layer {layer}, {split}")
    ax.set_title(row, fontsize=9)
  axes[0].legend(fontsize=6)
  _label_panels(axes, "query position (source tokens)", "attention entropy (nats)")
  fig.suptitle(
      "Encoder self-attention entropy by query position, test (solid) and test_long "
      "(dashed) sources\nmean over heads and sentences, positions at least "
      f"{report_length.MIN_TOKENS_PER_POSITION} sentences reach; uniform over n keys: log n; each "
      f"row's lowest seed\n{describe(drawn)}", fontsize=9)
  return save(fig, path)


def plot_results(results_path: str, output_dir: str) -> list[str]:
  """Writes every plot that `results.json` supports; returns their paths."""
  runs = report.load_runs(results_path)
  made = [
      plot_bleu_vs_k(runs, os.path.join(output_dir, "bleu_vs_k.png")),
      plot_bleu_vs_length(runs, os.path.join(output_dir, "bleu_vs_length.png")),
      plot_bleu_vs_step(runs, os.path.join(output_dir, "bleu_vs_step.png")),
      plot_length_oracle(runs, os.path.join(output_dir, "length_oracle.png")),
      plot_length_ratio(runs, os.path.join(output_dir, "length_ratio.png")),
      plot_token_accuracy(runs, os.path.join(output_dir, "token_accuracy.png")),
      plot_attention_entropy(runs, os.path.join(output_dir, "attention_entropy.png"))
  ]
  return [p for p in made if p]
