"""`table.md` from `results.json` alone: mean ± std over seeds, the paper beside it, findings.

`results.json` (schema version RESULTS_SCHEMA_VERSION, written by `relpos.experiments.runner`)
holds

    {"schema_version": 3, "written_at": "2025-01-31T12:00:00+00:00" (UTC),
     "jax_version": "...", "flax_version": "...", "device_kind": "cpu", "device_count": 1,
     "runs": [run, ...]}

with one run per (table, row, seed), each also holding the "environment" (versions, device,
"finished_at") it was made in:

    {"table": "ablation" | "k_sweep", "row": "rel_kv" | "k=4", "seed": 0,
     "k": 4 | None, "task": "synthetic", "commit": "...", "wall_time_s": ...,
     "time_s": {"training": ..., "validation": ..., "evaluation": ...} (schema 3: where
     wall_time_s went, see `relpos.experiments.runner.run_one`),
     "steps_per_second": ..., "num_params": ...,
     "validation_curve": [[step, validation BLEU], ...] (schema 2),
     "starts": [{"started_at", "step", "commit", "host"}, ...], "commits": [...] (schema 4:
     every start of the run and the commits it ran under, oldest first),
     "scores": {split: {"bleu": ..., "chrf": ..., "signature": ..., ...}},
     "other_checkpoints": {"average:10": {split: {...}}, ...} (schema 4: the scores of
     `decode.other_checkpoints` beside `decode.checkpoint`'s),
     "bleu_by_source_length": {split: {"13-16": ..., "24": ..., ...}},
     "position_statistics": {...} (`relpos.experiments.analysis`), "config": {...}}
"""

import json
import math
import os
from collections.abc import Sequence
from typing import NamedTuple

from scipy import stats

from relpos.experiments import paper

# A predicted gap must be at least this many BLEU; a predicted match may miss by this much.
MARGIN_BLEU = 1.0
# Significance level of the Welch's t-tests behind the findings (95% confidence intervals).
ALPHA = 0.05
# Fewer seeds per row than this and a finding gets no verdict.
MIN_SEEDS = 3


# 1: {"runs"} only; 2: + schema_version, written_at, versions and device (file and runs), each
# run's validation_curve; 3: + each run's time_s; 4: + each run's starts, commits and
# other_checkpoints, and time_s summed over every start of a run; 5: + each run's length
# diagnostics (length_statistics, oracle_length, token_accuracy_by_position, attention_profile)
# and the length table.
RESULTS_SCHEMA_VERSION = 5


def load_runs(results_path: str) -> list[dict]:
  """Reads the runs of a `results.json` file of this or an earlier schema version.

  Raises:
    ValueError: the file has a newer schema version than this code reads.
  """
  with open(results_path, encoding="utf-8") as f:
    results = json.load(f)
  version = results.get("schema_version", 1)
  if version > RESULTS_SCHEMA_VERSION:
    raise ValueError(f"{results_path}: schema_version={version} is newer than this relpos "
                     f"reads ({RESULTS_SCHEMA_VERSION}); update relpos.")
  return results["runs"]


def mean_std(values: Sequence[float]) -> tuple[float, float]:
  """Mean and sample standard deviation (0 for a single value)."""
  mean = sum(values) / len(values)
  if len(values) < 2:
    return mean, 0.0
  var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
  return mean, math.sqrt(var)


def _format(values: Sequence[float]) -> str:
  if not values:
    return "–"
  mean, std = mean_std(values)
  return f"{mean:.1f} ± {std:.1f}" if len(values) > 1 else f"{mean:.1f}"


def rows_in_order(runs: list[dict], table: str) -> list[str]:
  rows = []
  for run in runs:
    if run["table"] == table and run["row"] not in rows:
      rows.append(run["row"])
  return rows


def _scores(runs: list[dict], table: str, row: str, split: str) -> list[float]:
  return [r["scores"][split]["bleu"] for r in runs
          if r["table"] == table and r["row"] == row and split in r["scores"]]


def _field(runs: list[dict], table: str, row: str, name: str) -> list[float]:
  """The values of `name` in the runs of (table, row) that have one (not None)."""
  return [r[name] for r in runs
          if r["table"] == table and r["row"] == row and r.get(name) is not None]


def bucket_label(bucket: str) -> str:
  """A length bucket's label: "12" for a bucket of one length (stored "12" or "12-12")."""
  low, _, high = bucket.partition("-")
  return low if high in ("", low) else bucket


def length_buckets(runs: list[dict], split: str) -> list[str]:
  buckets = []
  for run in runs:
    for bucket in run.get("bleu_by_source_length", {}).get(split, {}):
      if bucket not in buckets:
        buckets.append(bucket)
  return sorted(buckets, key=lambda b: int(b.split("-")[0]))


def splits_in_order(runs: list[dict]) -> list[str]:
  """The scored splits of `runs`: validation first, then in order of first appearance."""
  splits = []
  for run in runs:
    for split in run["scores"]:
      if split not in splits:
        splits.append(split)
  return sorted(splits, key=lambda s: s != "validation")


def main_test_split(runs: list[dict]) -> str:
  """The split findings are judged on: `test`, else the task's first held-out test split."""
  held_out = [s for s in splits_in_order(runs) if s not in ("validation", "test_long")]
  return "test" if "test" in held_out or not held_out else held_out[0]


class Comparison(NamedTuple):
  """Welch's t-test of mean(a) - mean(b)."""
  difference: float
  low: float  # 95% confidence interval of the difference (Welch-Satterthwaite df).
  high: float
  p: float  # two-sided p-value.


def welch(a: Sequence[float], b: Sequence[float]) -> Comparison:
  """Welch's t-test (unequal variances) of two samples of at least 2 values each.

  When both samples are constant the difference is exact: p = 1 if it is 0, else 0.
  """
  (mean_a, std_a), (mean_b, std_b) = mean_std(a), mean_std(b)
  difference = mean_a - mean_b
  var_a, var_b = std_a ** 2 / len(a), std_b ** 2 / len(b)  # squared standard errors
  if var_a + var_b == 0:
    return Comparison(difference, difference, difference, float(difference == 0))
  se = math.sqrt(var_a + var_b)
  df = (var_a + var_b) ** 2 / (var_a ** 2 / (len(a) - 1) + var_b ** 2 / (len(b) - 1))
  half_width = float(stats.t.ppf(1 - ALPHA / 2, df)) * se
  return Comparison(difference, difference - half_width, difference + half_width,
                    float(2 * stats.t.sf(abs(difference) / se, df)))


def judge(a: Sequence[float], b: Sequence[float], *, gap: bool, margin: float
          ) -> tuple[str, str]:
  """Verdict and statistics of a prediction about mean(a) - mean(b).

  Args:
    a, b: one value per seed.
    gap: True predicts a above b by at least `margin`, significantly ("yes" only then);
      False predicts a no worse than b by more than `margin` ("no" only when the data shows,
      significantly, a larger deficit).
    margin: in the values' unit.

  Returns:
    ("yes" | "no" | "not enough seeds" (fewer than MIN_SEEDS values in a or b),
     "difference [95% CI], p" or "" without a test).
  """
  if min(len(a), len(b)) < MIN_SEEDS:
    return "not enough seeds", ""
  c = welch(a, b)
  significant = c.p < ALPHA
  if gap:
    holds = significant and c.difference >= margin
  else:
    holds = not (significant and c.difference < -margin)
  return ("yes" if holds else "no",
          f"{c.difference:+.1f} [{c.low:+.1f}, {c.high:+.1f}], p = {c.p:.2g}")


def _extreme_rows(rows: dict[str, list[float]]) -> tuple[str, str]:
  """The rows of highest and lowest mean."""
  by_mean = sorted(rows, key=lambda r: mean_std(rows[r])[0])
  return by_mean[-1], by_mean[0]


def findings(runs: list[dict]) -> list[tuple[str, str, str]]:
  """Checks each of the paper's findings against the runs, with the spread over seeds.

  Every finding compares two sets of per-seed values by Welch's t-test (see `judge`); the
  k-sweep findings compare rows of the k sweep only, and "flat for k >= 2" needs two values of
  k at least.

  Returns:
    (finding, verdict, evidence) triples; verdict is "yes", "no", "not enough seeds" or
    "not run" where the rows it needs are missing.
  """
  test_split = main_test_split(runs)
  bleu = lambda row, table="ablation", split=test_split: _scores(runs, table, row, split)
  speed = lambda row: _field(runs, "ablation", row, "steps_per_second")
  out = []

  def check(finding, a, b, *, gap, margin=MARGIN_BLEU, evidence, needs=()):
    """Judges the finding on values a against b (see `judge`); evidence() describes them.
    "not run" when a, b or any list in `needs` is empty."""
    if not (a and b and all(needs)):
      out.append((finding, "not run", "–"))
      return
    verdict, statistics = judge(a, b, gap=gap, margin=margin)
    out.append((finding, verdict, evidence() + (f": {statistics}" if statistics else "")))

  rel, ab, none_ = bleu("rel_kv"), bleu("abs"), bleu("none")
  check(f"1. relative matches or beats absolute ({test_split} BLEU)", rel, ab, gap=False,
        evidence=lambda: f"rel_kv {_format(rel)} vs abs {_format(ab)}")
  check("2. no position information collapses quality", rel, none_, gap=True,
        evidence=lambda: f"rel_kv {_format(rel)} vs none {_format(none_)}")
  sweep = {r: bleu(r, "k_sweep") for r in rows_in_order(runs, "k_sweep")}
  k_of = lambda row: int(row.split("=")[1])
  positive = {r: v for r, v in sweep.items() if k_of(r) >= 1}
  lowest = _extreme_rows(positive)[1] if positive else None
  k0 = sweep.get("k=0", [])
  check("2b. k = 0 collapses like no position (within the k sweep)",
        positive.get(lowest, []), k0, gap=True,
        evidence=lambda: f"lowest k >= 1, {lowest} {_format(positive[lowest])}, "
                         f"vs k=0 {_format(k0)}")
  flat = {r: v for r, v in sweep.items() if k_of(r) >= 2}
  high, low = _extreme_rows(flat) if len(flat) >= 2 else (None, None)
  check("3. quality is flat for k >= 2", flat.get(low, []), flat.get(high, []), gap=False,
        evidence=lambda: f"{len(flat)} values of k; lowest {low} {_format(flat[low])} vs "
                         f"highest {high} {_format(flat[high])}")
  rel_k, rel_v = bleu("rel_k"), bleu("rel_v")
  check("4a. a^K alone recovers all of it", rel_k, rel, gap=False,
        evidence=lambda: f"rel_k {_format(rel_k)} vs rel_kv {_format(rel)}")
  half = (mean_std(rel)[0] - mean_std(none_)[0]) / 2 if rel and none_ else 0.0
  check("4b. a^V alone recovers most of it", rel_v, none_, gap=True, margin=half, needs=[rel],
        evidence=lambda: f"rel_v {_format(rel_v)} vs none {_format(none_)}, more than half "
                         f"of rel_kv's gain ({half:.1f})")
  slowest = 1 - paper.SPEED_DROP - 0.05
  s_rel, s_abs = speed("rel_kv"), speed("abs")
  check(f"5. rel_kv costs about {paper.SPEED_DROP:.0%} of steps per second", s_rel,
        [slowest * s for s in s_abs], gap=False, margin=0.0,
        evidence=lambda: f"drop {1 - mean_std(s_rel)[0] / mean_std(s_abs)[0]:.1%} "
                         f"({mean_std(s_rel)[0]:.2f} vs {mean_std(s_abs)[0]:.2f} steps/s), "
                         f"against {slowest:.0%} of abs, in steps/s")
  long_rel, long_abs = bleu("rel_kv", split="test_long"), bleu("abs", split="test_long")
  check("6. (later work) relative beats absolute on longer sentences", long_rel, long_abs,
        gap=True, evidence=lambda: f"test_long rel_kv {_format(long_rel)} vs abs "
                                   f"{_format(long_abs)}")
  return out


def _table_section(runs: list[dict], table: str) -> list[str]:
  rows = rows_in_order(runs, table)
  if not rows:
    return []
  table_runs = [r for r in runs if r["table"] == table]
  splits = splits_in_order(table_runs)
  test_split = main_test_split(table_runs)
  # Lower-cased BLEU and chrF only where every run has them (older runs lack the first).
  beside = [(name, label) for name, label in (("bleu_lowercase", "BLEU (lower-cased)"),
                                              ("chrf", "chrF"))
            if all(name in r["scores"].get(test_split, {}) for r in table_runs)]
  others = other_checkpoints(table_runs)
  header = (["row", "seeds"] + [f"{s} BLEU" for s in splits]
            + [f"{test_split} {label}" for _, label in beside]
            + [f"{test_split} BLEU ({choice})" for choice in others]
            + ["paper", "params", "steps/s"])
  lines = [f"## {table}", "", "| " + " | ".join(header) + " |",
           "|" + " --- |" * len(header)]
  for row in rows:
    if table == "k_sweep":
      k = int(row.split("=")[1])
      figure = paper.K_SWEEP_FIGURES.get(k)
      paper_cell = f"{figure}" if figure is not None else "–"
    else:
      figure = paper.ABLATION_FIGURES.get(row)
      paper_cell = f"{figure[0]} ({figure[1]})" if figure else "–"
    seeds = len(_field(runs, table, row, "seed"))
    params = _field(runs, table, row, "num_params")
    speed = _field(runs, table, row, "steps_per_second")
    cells = [row, str(seeds)] + [_format(_scores(runs, table, row, s)) for s in splits]
    row_runs = [r for r in table_runs if r["row"] == row]
    cells += [_format([r["scores"][test_split][name] for r in row_runs]) for name, _ in beside]
    cells += [_format([r["other_checkpoints"][choice][test_split]["bleu"] for r in row_runs
                       if choice in r.get("other_checkpoints", {})]) for choice in others]
    cells += [paper_cell, f"{params[0]:,}" if params else "–",
              f"{mean_std(speed)[0]:.2f}" if speed else "–"]
    lines.append("| " + " | ".join(cells) + " |")
  lines += ["", *_time_lines(table_runs)]
  for split in [s for s in splits if s != "validation"]:
    buckets = length_buckets(table_runs, split)
    if not buckets:
      continue
    lines += [f"BLEU by source length (words), {split}:", "",
              "| row | " + " | ".join(map(bucket_label, buckets)) + " |",
              "|" + " --- |" * (len(buckets) + 1)]
    for row in rows:
      cells = []
      for bucket in buckets:
        values = [r["bleu_by_source_length"][split][bucket] for r in runs
                  if r["table"] == table and r["row"] == row
                  and bucket in r.get("bleu_by_source_length", {}).get(split, {})]
        cells.append(_format(values))
      lines.append(f"| {row} | " + " | ".join(cells) + " |")
    lines.append("")
  return lines


def other_checkpoints(runs: list[dict]) -> list[str]:
  """The checkpoint choices scored beside the main one (`decode.other_checkpoints`) in any of
  `runs`, in order of first appearance."""
  choices = []
  for run in runs:
    for choice in run.get("other_checkpoints", {}):
      if choice not in choices:
        choices.append(choice)
  return choices


def _time_lines(runs: list[dict]) -> list[str]:
  """Where a run's wall time went, averaged over the runs that record it (schema 3); no line
  when none does."""
  timed = [r for r in runs if "time_s" in r]
  if not timed:
    return []
  mean = lambda values: sum(values) / len(timed)
  parts = {part: mean([r["time_s"][part] for r in timed])
           for part in ("training", "validation", "evaluation")}
  return [f"Time per run (mean of {len(timed)}): {mean([r['wall_time_s'] for r in timed]):.0f} s"
          f" = training {parts['training']:.0f} s (steps, compilation, checkpoints) + "
          f"validation during training {parts['validation']:.0f} s + final evaluation "
          f"{parts['evaluation']:.0f} s (every split, position statistics).", ""]


def render_table(runs: list[dict]) -> str:
  """The markdown of `table.md` for the given runs."""
  tasks = sorted({r["task"] for r in runs})
  commits = list(dict.fromkeys(c for r in runs for c in r.get("commits", [r["commit"]])))
  lines = [f"# relpos results: {', '.join(tasks)}", "",
           f"Made from results.json ({len(runs)} runs; commits {', '.join(commits)}). "
           "BLEU is cased sacreBLEU (mean ± sample std over seeds); the paper's figures are "
           "WMT14 EN-DE, for the direction of each effect, not its size.", ""]
  signatures = sorted({scores["signature"] for r in runs for scores in r["scores"].values()
                       if "signature" in scores})
  if signatures:
    lines += [f"sacreBLEU signature: `{', '.join(signatures)}`.", ""]
  scored = sorted({r["config"].get("decode", {}).get("checkpoint", "best") for r in runs})
  others = other_checkpoints(runs)
  lines += [f"Checkpoint scored: {', '.join(scored)} ('best' by validation BLEU)"
            + (f"; beside it {', '.join(others)} ('average:N': the parameters of the last N "
               "checkpoints averaged)" if others else "") + ".", ""]
  for table in ("ablation", "k_sweep"):
    lines += _table_section(runs, table)
  lines += ["## The paper's findings, here", "",
            f"Each finding compares the per-seed values of two rows ({main_test_split(runs)} "
            f"BLEU unless it says otherwise) by Welch's t-test: difference of means [95% "
            f"confidence interval], two-sided p. A predicted gap reproduces when it is at "
            f"least {MARGIN_BLEU} BLEU (4b: half of rel_kv's gain over none) and significant "
            f"(p < {ALPHA}); a predicted match (1, 3, 4a, 5) reproduces unless the data shows "
            f"a significant shortfall of more than {MARGIN_BLEU} BLEU (5: below the speed "
            f"named). Rows with fewer than {MIN_SEEDS} seeds get no verdict.", "",
            "| finding | reproduced | evidence |",
            "| --- | --- | --- |"]
  lines += [f"| {f} | {v} | {e} |" for f, v, e in findings(runs)]
  return "\n".join(lines) + "\n"


def write_table(results_path: str, table_path: str) -> str:
  """Rebuilds `table.md` from `results.json` alone; returns the markdown."""
  text = render_table(load_runs(results_path))
  tmp = table_path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    f.write(text)
  os.replace(tmp, table_path)
  return text
