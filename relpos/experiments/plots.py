"""PNG plots made from `results.json`: BLEU against k and BLEU against source length."""

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

from relpos.experiments import paper
from relpos.experiments import report


def _save(fig, path: str) -> str:
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
  fig, ax = plt.subplots(figsize=(5.5, 3.8))
  held_out = [s for s in report.splits_in_order(sweep) if s != "validation"]
  for split, style in zip(held_out, ("o-", "s--", "^-.")):
    points = [(k, [r["scores"][split]["bleu"] for r in sweep
                   if r["k"] == k and split in r["scores"]]) for k in ks]
    points = [(k, v) for k, v in points if v]
    if points:
      stats = [report.mean_std(v) for _, v in points]
      ax.errorbar([k for k, _ in points], [m for m, _ in stats], yerr=[s for _, s in stats],
                  fmt=style, capsize=3, label=f"relpos, {split}")
  ax.plot(list(paper.K_SWEEP_FIGURES), list(paper.K_SWEEP_FIGURES.values()), "k:",
          marker="x", label="paper (WMT14 dev)")
  ax.set_xscale("symlog", linthresh=1)
  ax.set_xticks(ks)
  ax.set_xticklabels([str(k) for k in ks])
  ax.set_xlabel("clipping distance k")
  ax.set_ylabel("BLEU")
  ax.legend(fontsize=8)
  return _save(fig, path)


def plot_bleu_vs_length(runs: list[dict], path: str) -> str | None:
  """BLEU against source length bucket (test splits in order), one line per ablation row.

  Returns:
    The path written, or None when the runs hold no per-length scores.
  """
  ablation = [r for r in runs if r["table"] == "ablation"]
  held_out = [s for s in report.splits_in_order(ablation) if s != "validation"]
  buckets = [(s, b) for s in held_out for b in report.length_buckets(ablation, s)]
  if not buckets:
    return None
  fig, ax = plt.subplots(figsize=(7, 4))
  for row in report.rows_in_order(ablation, "ablation"):
    xs, ys = [], []
    for x, (split, bucket) in enumerate(buckets):
      values = [r["bleu_by_source_length"][split][bucket] for r in ablation
                if r["row"] == row and bucket in r.get("bleu_by_source_length", {}).get(split, {})]
      if values:
        xs.append(x)
        ys.append(report.mean_std(values)[0])
    ax.plot(xs, ys, marker="o", label=row)
  ax.set_xticks(range(len(buckets)))
  ax.set_xticklabels([b for _, b in buckets], rotation=45)
  if "test_long" in held_out:
    boundary = sum(1 for s, _ in buckets if s != "test_long") - 0.5
    ax.axvline(boundary, color="grey", linestyle=":")
    ax.text(boundary + 0.1, ax.get_ylim()[1] * 0.95, "longer than training", fontsize=8)
  ax.set_xlabel("source length (words)")
  ax.set_ylabel("BLEU")
  ax.legend(fontsize=7, ncol=2)
  return _save(fig, path)


def plot_results(results_path: str, output_dir: str) -> list[str]:
  """Writes every plot that `results.json` supports; returns their paths."""
  runs = report.load_runs(results_path)
  made = [plot_bleu_vs_k(runs, os.path.join(output_dir, "bleu_vs_k.png")),
          plot_bleu_vs_length(runs, os.path.join(output_dir, "bleu_vs_length.png"))]
  return [p for p in made if p]
