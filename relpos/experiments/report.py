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
     wall_time_s went, see `relpos.experiments.single_run.run_one`),
     "steps_per_second": ..., "num_params": ...,
     "validation_curve": [[step, validation BLEU], ...] (schema 2),
     "starts": [{"started_at", "step", "commit", "host"}, ...], "commits": [...] (schema 4:
     every start of the run and the commits it ran under, oldest first),
     "scores": {split: {"bleu": ..., "chrf": ..., "signature": ..., ...}},
     "other_checkpoints": {"average:10": {split: {...}}, ...} (schema 4: the scores of
     `decode.other_checkpoints` beside `decode.checkpoint`'s),
     "bleu_by_source_length": {split: {"13-16": ..., "24": ..., ...}},
     "position_statistics": {...} (`relpos.experiments.analysis`), "config": {...},
     schema 5, the length diagnostics (`relpos.experiments.diagnostics`), per test split:
     "length_statistics": {split: {"unit", "ratio", "shorter", "longer", "num_sentences",
       "by_source_length": {bucket: {"ratio", "shorter", "longer", "num_sentences"}}}},
     "oracle_length": {split: {"bleu", "chrf", ..., "bleu_by_source_length": {...}}},
     "token_accuracy_by_position": {split: {"accuracy": [...], "count": [...],
       "eos_accuracy", "accuracy_all"}},
     "attention_profile": {split: {"entropy_by_query": [layer][position],
       "normalized_entropy": [layer], "attention_by_offset", "offsets", "count_by_query",
       "mean_length"}}}

The `length` table (issue #27) shows test and test_long BLEU beside test_long BLEU at the
references' lengths (oracle length) and the test_long length ratio, with its own findings
(`length_findings`).
"""

import json
import math
import os
from collections.abc import Sequence
from typing import NamedTuple

from scipy import stats

from relpos.experiments import paper
from relpos.experiments import tables

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
  if table == "length":
    return (["## length", "", *_length_table_lines(table_runs, rows), *_time_lines(table_runs),
             *_diagnostics_lines(runs, table, rows)])
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
  with_oracle = all("oracle_length" in r for r in table_runs)  # its BLEU by length below
  for split in [s for s in splits if s != "validation"]:
    buckets = length_buckets(table_runs, split)
    if not buckets or with_oracle:
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
  return lines + _diagnostics_lines(runs, table, rows)


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
          f"{parts['evaluation']:.0f} s (every split, position statistics, length "
          f"diagnostics).", ""]


def long_split(runs: list[dict]) -> str:
  """The split the length table is about: `test_long` where scored, else the main test split
  (a task without a longer split)."""
  return "test_long" if "test_long" in splits_in_order(runs) else main_test_split(runs)


def _row_runs(runs: list[dict], table: str, row: str) -> list[dict]:
  return [r for r in runs if r["table"] == table and r["row"] == row]


def _oracle(runs: list[dict], split: str) -> list[float]:
  """Oracle-length BLEU of `split`, one per run that has it (schema 5)."""
  return [r["oracle_length"][split]["bleu"] for r in runs
          if split in r.get("oracle_length", {})]


def _length_value(runs: list[dict], split: str, name: str) -> list[float]:
  """`length_statistics[split][name]` ("ratio", "shorter", "longer"), one per run."""
  return [r["length_statistics"][split][name] for r in runs
          if split in r.get("length_statistics", {})]


def recovered_shares(runs: list[dict], test_split: str, long: str) -> list[float]:
  """Per run: the share of its drop (test BLEU minus long-split BLEU) that oracle-length
  decoding of the long split recovers, (oracle - long) / (test - long); runs without a drop
  or an oracle score are left out."""
  shares = []
  for r in runs:
    if long not in r.get("oracle_length", {}) or test_split == long:
      continue
    test, plain = r["scores"][test_split]["bleu"], r["scores"][long]["bleu"]
    if test > plain:
      shares.append((r["oracle_length"][long]["bleu"] - plain) / (test - plain))
  return shares


def _percent(values: Sequence[float]) -> str:
  if not values:
    return "–"
  mean, std = mean_std(values)
  return f"{100 * mean:.0f}% ± {100 * std:.0f}%" if len(values) > 1 else f"{100 * mean:.0f}%"


def _ratio(values: Sequence[float]) -> str:
  if not values:
    return "–"
  mean, std = mean_std(values)
  return f"{mean:.2f} ± {std:.2f}" if len(values) > 1 else f"{mean:.2f}"


def _length_table_lines(runs: list[dict], rows: list[str]) -> list[str]:
  """The main table of the length table: test, long split, long split at oracle length, its
  length ratio and early / late stops, and the share of the drop oracle length recovers."""
  test_split, long = main_test_split(runs), long_split(runs)
  splits = [test_split] + ([long] if long != test_split else [])
  header = (["row", "seeds"] + [f"{s} BLEU" for s in splits]
            + [f"{long} BLEU (oracle length)", f"{long} length ratio", f"{long} shorter",
               f"{long} longer", "drop recovered by oracle length"])
  lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
  for row in rows:
    row_runs = _row_runs(runs, "length", row)
    cells = [row, str(len(row_runs))]
    cells += [_format(_scores(runs, "length", row, s)) for s in splits]
    cells += [_format(_oracle(row_runs, long)), _ratio(_length_value(row_runs, long, "ratio")),
              _percent(_length_value(row_runs, long, "shorter")),
              _percent(_length_value(row_runs, long, "longer")),
              _percent(recovered_shares(row_runs, test_split, long))]
    lines.append("| " + " | ".join(cells) + " |")
  return lines + ["", f"Length ratio: hypothesis over reference length, summed over the split, "
                      f"in target tokens (the task's SentencePiece pieces, eos excluded); "
                      f"shorter / longer: the share of hypotheses that stop before / run past "
                      f"their reference's length. Oracle length: beam search with eos "
                      f"forbidden before the reference's length in target tokens and forced "
                      f"at it (Newman et al. 2020). Drop recovered: (oracle {long} - {long}) / "
                      f"({test_split} - {long}) BLEU, per seed.", ""]


def _bucket_table(runs: list[dict], rows: list[str], table: str, split: str, title: str,
                  cell) -> list[str]:
  """A row x source-length bucket table; cell(runs of the row, bucket) -> text."""
  buckets = length_buckets(runs, split)
  if not buckets:
    return []
  lines = [title, "", "| row | " + " | ".join(map(bucket_label, buckets)) + " |",
           "|" + " --- |" * (len(buckets) + 1)]
  for row in rows:
    row_runs = _row_runs(runs, table, row)
    lines.append(f"| {row} | " + " | ".join(cell(row_runs, b) for b in buckets) + " |")
  return lines + [""]


def _diagnostics_lines(runs: list[dict], table: str, rows: list[str]) -> list[str]:
  """The length diagnostics of a table's runs (schema 5), per test split: BLEU and oracle-
  length BLEU by source length, the length ratio and early stops by source length, the
  teacher-forced token accuracy by target position and the encoder's attention entropy."""
  table_runs = [r for r in runs if r["table"] == table and "length_statistics" in r]
  if not table_runs:
    return []
  lines = []
  for split in [s for s in splits_in_order(table_runs) if s != "validation"]:
    def bleu_cell(row_runs, bucket, split=split):
      plain = [r["bleu_by_source_length"][split][bucket] for r in row_runs
               if bucket in r.get("bleu_by_source_length", {}).get(split, {})]
      oracle = [r["oracle_length"][split]["bleu_by_source_length"][bucket] for r in row_runs
                if bucket in r.get("oracle_length", {}).get(split, {}).get(
                    "bleu_by_source_length", {})]
      return f"{_format(plain)} → {_format(oracle)}"

    def ratio_cell(row_runs, bucket, split=split):
      stats = [r["length_statistics"][split]["by_source_length"][bucket] for r in row_runs
               if bucket in r.get("length_statistics", {}).get(split, {}).get(
                   "by_source_length", {})]
      return (f"{_ratio([x['ratio'] for x in stats])} "
              f"({_percent([x['shorter'] for x in stats])} short)") if stats else "–"

    lines += _bucket_table(table_runs, rows, table, split,
                           f"BLEU → BLEU at oracle length, by source length (words), {split}:",
                           bleu_cell)
    lines += _bucket_table(table_runs, rows, table, split,
                           f"Length ratio (target tokens) and share of early stops, by source "
                           f"length (words), {split}:", ratio_cell)
  lines += _accuracy_lines(table_runs, table, rows)
  lines += _attention_lines(table_runs, table, rows)
  return lines


# Target positions are shown in ranges of this many tokens.
POSITION_RANGE = 8


def _accuracy_lines(runs: list[dict], table: str, rows: list[str]) -> list[str]:
  """Teacher-forced token accuracy (%) by target position range and on eos, per test split."""
  lines = []
  for split in [s for s in splits_in_order(runs) if s != "validation"]:
    have = [r for r in runs if split in r.get("token_accuracy_by_position", {})]
    if not have:
      continue
    counts = [sum(c) for c in zip(*(r["token_accuracy_by_position"][split]["count"]
                                    for r in have))]
    last = max((i for i, c in enumerate(counts) if c), default=-1)
    ranges = [(low, min(low + POSITION_RANGE, last + 1))
              for low in range(0, last + 1, POSITION_RANGE)]
    lines += [f"Teacher-forced token accuracy (%) by target position (tokens, from 0), and on "
              f"eos, {split}:", "",
              "| row | " + " | ".join(f"{a}-{b - 1}" if b - 1 > a else f"{a}"
                                      for a, b in ranges) + " | eos |",
              "|" + " --- |" * (len(ranges) + 2)]
    for row in rows:
      row_runs = [r for r in have if r["row"] == row]
      cells = []
      for low, high in ranges:
        values = []
        for r in row_runs:
          stats = r["token_accuracy_by_position"][split]
          count = sum(stats["count"][low:high])
          if count:
            values.append(100 * sum(a * c for a, c in zip(stats["accuracy"][low:high],
                                                          stats["count"][low:high]) if c)
                          / count)
        cells.append(_format(values))
      eos = [100 * r["token_accuracy_by_position"][split]["eos_accuracy"] for r in row_runs]
      lines.append(f"| {row} | " + " | ".join(cells) + f" | {_format(eos)} |")
    lines.append("")
  return lines


def _attention_lines(runs: list[dict], table: str, rows: list[str]) -> list[str]:
  """Normalized entropy of the encoder's self-attention per layer, each test split side by
  side (1 = uniform over the sentence, 0 = one key)."""
  splits = [s for s in splits_in_order(runs) if s != "validation"
            and any(s in r.get("attention_profile", {}) for r in runs)]
  if not splits:
    return []
  layers = max(len(r["attention_profile"][s]["normalized_entropy"]) for r in runs
               for s in splits if s in r.get("attention_profile", {}))
  header = [f"layer {layer} ({' / '.join(splits)})" for layer in range(layers)]
  lines = [f"Encoder self-attention entropy over log(sentence length) (1 = uniform, 0 = one "
           f"key), {' / '.join(splits)} sources:", "",
           "| row | " + " | ".join(header) + " |", "|" + " --- |" * (layers + 1)]
  for row in rows:
    row_runs = [r for r in runs if r["row"] == row]
    cells = []
    for layer in range(layers):
      cells.append(" / ".join(
          _ratio([r["attention_profile"][s]["normalized_entropy"][layer] for r in row_runs
                  if s in r.get("attention_profile", {})
                  and layer < len(r["attention_profile"][s]["normalized_entropy"])])
          for s in splits))
    lines.append(f"| {row} | " + " | ".join(cells) + " |")
  return lines + [""]


def length_findings(runs: list[dict]) -> list[tuple[str, str, str]]:
  """The length table's findings, each judged by Welch's t-test over seeds (`judge`).

  (i) each relative row beats abs on the long split (Rosendahl et al. 2019); (ii) per row,
  oracle length lifts the long split (with the share of the drop it recovers); (iii) each
  intervention of `tables.LENGTH_BASES` lifts the long split over its base row, with its
  cost on the test split.

  Returns:
    (finding, verdict, evidence) triples; verdict "yes", "no", "not enough seeds" or
    "not run".
  """
  table_runs = [r for r in runs if r["table"] == "length"]
  test_split, long = main_test_split(table_runs), long_split(table_runs)
  bleu = lambda row, split: _scores(runs, "length", row, split)
  out = []

  def check(finding, a, b, *, gap, evidence, after=""):
    """Judges a against b (`judge`); evidence() describes them, `after` follows the test."""
    if not (a and b):
      out.append((finding, "not run", "–"))
      return
    verdict, statistics = judge(a, b, gap=gap, margin=MARGIN_BLEU)
    out.append((finding, verdict,
                evidence() + (f": {statistics}" if statistics else "") + after))

  base = bleu("abs", long)
  for row in ("rel_kv", "t5", "rope", "alibi", "fire"):
    values = bleu(row, long)
    check(f"(i) {row} beats abs on {long} (Rosendahl et al. 2019)", values, base, gap=True,
          evidence=lambda: f"{row} {_format(values)} vs abs {_format(base)}")
  for row in rows_in_order(runs, "length"):
    row_runs = _row_runs(runs, "length", row)
    oracle, plain = _oracle(row_runs, long), bleu(row, long)
    share = recovered_shares(row_runs, test_split, long)
    check(f"(ii) {row}: oracle length lifts {long}", oracle, plain, gap=True,
          evidence=lambda: (f"recovers {_percent(share)} of the drop; oracle "
                            f"{_format(oracle)} vs {_format(plain)}"))
  for row, base_row in tables.LENGTH_BASES:
    a, b = bleu(row, long), bleu(base_row, long)
    cost = _cost(bleu(row, test_split), bleu(base_row, test_split), test_split)
    check(f"(iii) {row} lifts {long} over {base_row}", a, b, gap=True,
          evidence=lambda: f"{long} {row} {_format(a)} vs {base_row} {_format(b)}",
          after=f"; change on {cost}")
  return out


def _cost(a: Sequence[float], b: Sequence[float], split: str) -> str:
  """An intervention's change on `split` against its base: the difference of means, with its
  95% interval and p where both have MIN_SEEDS values."""
  if not (a and b):
    return f"{split}: not run"
  if min(len(a), len(b)) < MIN_SEEDS:
    return f"{split} {mean_std(a)[0] - mean_std(b)[0]:+.1f}"
  c = welch(a, b)
  return f"{split} {c.difference:+.1f} [{c.low:+.1f}, {c.high:+.1f}], p = {c.p:.2g}"


def _length_findings_lines(runs: list[dict]) -> list[str]:
  """The length table's findings section."""
  return ["## Length findings", "",
          f"Each finding compares per-seed values by Welch's t-test: difference of means [95% "
          f"confidence interval], two-sided p; a gap holds when it is at least {MARGIN_BLEU} "
          f"BLEU and significant (p < {ALPHA}). (ii) also gives the share of the drop "
          f"({main_test_split(runs)} minus {long_split(runs)} BLEU) that oracle length "
          f"recovers; (iii) gives each intervention's change on {main_test_split(runs)} (its "
          f"cost). Rows with fewer than {MIN_SEEDS} seeds get no verdict.", "",
          "| finding | holds | evidence |", "| --- | --- | --- |",
          *(f"| {f} | {v} | {e} |" for f, v, e in length_findings(runs)), ""]


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
  for table in ("ablation", "k_sweep", "length"):
    lines += _table_section(runs, table)
  if any(r["table"] == "length" for r in runs):
    lines += _length_findings_lines(runs)
  if all(r["table"] == "length" for r in runs):
    return "\n".join(lines) + "\n"
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
