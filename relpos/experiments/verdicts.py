"""The numbers and verdicts behind `table.md`, from the runs of `results.json`
(`relpos.experiments.report.load_runs`): each row's per-seed values, their mean ± sample std,
Welch's t-test of two rows (a paired one of one row decoded two ways), and the verdicts on
the paper's findings (`findings`) and on the length table's (`length_findings`).
`relpos.experiments.report` lays them out as markdown.

Values are lists with one entry per run (seed) of a (table, row): [runs].
"""

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

from scipy import stats

from relpos.experiments import paper
from relpos.experiments import tables
from relpos.experiments import timing

# A predicted gap must be at least this many BLEU; a predicted match may miss by this much.
MARGIN_BLEU = 1.0
# Significance level of the Welch's t-tests behind the findings (95% confidence intervals).
ALPHA = 0.05
# Fewer seeds per row than this and a finding gets no verdict.
MIN_SEEDS = 3
# The verdict of a prediction whose 95% confidence interval straddles its bound (`judge`).
INCONCLUSIVE = "inconclusive"
# `judge`'s rule, as the tables state it.
RULE = ("A prediction holds (yes) when the whole interval lies on its side of the prediction's "
        "bound, fails (no) when the whole interval lies on the other side, and is inconclusive "
        "when the interval straddles the bound: the seeds cannot tell. Each interval and p is "
        "the finding's own, not corrected for the number of findings tested.")
# The synthetic task's test_long sentences built only of constructions seen in training
# (`relpos.data.synthetic.SEEN_CONSTRUCTIONS`, a subset of `bleu_by_subset`): length alone.
LENGTH_ALONE_SUBSET = "seen constructions"
# Its split of its own, of test_long's lengths (`task.synthetic.num_test_long_seen` sentences).
LENGTH_ALONE_SPLIT = "test_long_seen"
# The relative rows finding (i) of the length table sets against abs.
RELATIVE_LENGTH_ROWS = ("rel_kv", "t5", "rope", "alibi", "fire")


def mean_std(values: Sequence[float]) -> tuple[float, float]:
  """Mean and sample standard deviation (0 for a single value)."""
  mean = sum(values) / len(values)
  if len(values) < 2:
    return mean, 0.0
  var = sum((v - mean)**2 for v in values) / (len(values) - 1)
  return mean, math.sqrt(var)


def format_mean_std(values: Sequence[float]) -> str:
  """"mean ± std" of values [n] to 0.1 ("mean" alone for one value, "–" for none)."""
  if not values:
    return "–"
  mean, std = mean_std(values)
  return f"{mean:.1f} ± {std:.1f}" if len(values) > 1 else f"{mean:.1f}"


def format_mean_std_of(values: Sequence[float], num_runs: int) -> str:
  """`format_mean_std` of values from some of a row's `num_runs` runs, saying how many when
  not all (runs scored before a measure existed lack it): "40.1 ± 0.2 (2 of 3 runs)"."""
  return of_runs(format_mean_std(values), len(values), num_runs)


def of_runs(cell: str, count: int, num_runs: int) -> str:
  """A cell made of `count` of a row's `num_runs` runs, saying so when not all (and not none):
  "0.66 ± 0.02 (2 of 3 runs)"."""
  return cell if count in (0, num_runs) else f"{cell} ({count} of {num_runs} runs)"


def format_percent(values: Sequence[float]) -> str:
  """"mean% ± std%" of shares [n] in 0..1, to 1% ("mean%" alone for one, "–" for none)."""
  if not values:
    return "–"
  mean, std = mean_std(values)
  return f"{100 * mean:.0f}% ± {100 * std:.0f}%" if len(values) > 1 else f"{100 * mean:.0f}%"


def format_ratio(values: Sequence[float]) -> str:
  """"mean ± std" of values [n] to 0.01 ("mean" alone for one value, "–" for none)."""
  if not values:
    return "–"
  mean, std = mean_std(values)
  return f"{mean:.2f} ± {std:.2f}" if len(values) > 1 else f"{mean:.2f}"


def rows_in_order(runs: list[dict], table: str) -> list[str]:
  """The rows of `table` in `runs`, in order of first appearance."""
  return list(dict.fromkeys(run["row"] for run in runs if run["table"] == table))


def splits_in_order(runs: list[dict]) -> list[str]:
  """The scored splits of `runs`: validation first, then in order of first appearance."""
  splits = dict.fromkeys(split for run in runs for split in run["scores"])
  return sorted(splits, key=lambda s: s != "validation")


def main_test_split(runs: list[dict]) -> str:
  """The split findings are judged on: `test`, else the task's first held-out test split."""
  held_out = [s for s in splits_in_order(runs) if s not in ("validation", "test_long")]
  return "test" if "test" in held_out or not held_out else held_out[0]


def long_split(runs: list[dict]) -> str:
  """The split the length table is about: `test_long` where scored, else the main test split
  (a task without a longer split)."""
  return "test_long" if "test_long" in splits_in_order(runs) else main_test_split(runs)


def bleu_values(runs: list[dict], table: str, row: str, split: str) -> list[float]:
  """BLEU on `split` of the runs of (table, row) that score it: [runs], one per seed."""
  return [
      r["scores"][split]["bleu"]
      for r in runs
      if r["table"] == table and r["row"] == row and split in r["scores"]
  ]


def subset_bleu_values(runs: list[dict], table: str, row: str, split: str,
                       subset: str) -> list[float]:
  """BLEU on `split`'s `subset` (`bleu_by_subset`) of the runs of (table, row) that score it
  (runs scored before 26 November 2026, or where the subset is empty, do not)."""
  scores = [
      r["scores"][split].get("bleu_by_subset", {}).get(subset, {}).get("bleu")
      for r in runs
      if r["table"] == table and r["row"] == row and split in r["scores"]
  ]
  return [bleu for bleu in scores if bleu is not None]


def field_values(runs: list[dict], table: str, row: str, name: str) -> list[float]:
  """The values of `name` in the runs of (table, row) that have one (not None)."""
  return [
      r[name] for r in runs if r["table"] == table and r["row"] == row and r.get(name) is not None
  ]


def runs_of_row(runs: list[dict], table: str, row: str) -> list[dict]:
  """The runs of (table, row), one per seed."""
  return [r for r in runs if r["table"] == table and r["row"] == row]


def oracle_bleu(runs: list[dict], split: str) -> list[float]:
  """Oracle-length BLEU of `split`, one per run that has it (schema 5)."""
  return [r["oracle_length"][split]["bleu"] for r in runs if split in r.get("oracle_length", {})]


def length_values(runs: list[dict], split: str, name: str) -> list[float]:
  """`length_statistics[split][name]` ("ratio", "shorter", "longer"), one per run."""
  return [
      r["length_statistics"][split][name] for r in runs if split in r.get("length_statistics", {})
  ]


def recovered_shares(runs: list[dict], test_split: str, long: str) -> list[float]:
  """Per run: the share of its drop (test BLEU minus long-split BLEU) that oracle-length
  decoding of the long split recovers, (oracle - long) / (test - long); runs without an
  oracle score, or whose drop is under MARGIN_BLEU (a share of almost nothing, unbounded),
  are left out."""
  shares = []
  for r in runs:
    if long not in r.get("oracle_length", {}) or test_split == long:
      continue
    test, plain = r["scores"][test_split]["bleu"], r["scores"][long]["bleu"]
    if test - plain >= MARGIN_BLEU:
      shares.append((r["oracle_length"][long]["bleu"] - plain) / (test - plain))
  return shares


class Comparison(NamedTuple):
  """A t-test of mean(a) - mean(b): Welch's (`welch`) or paired (`paired`)."""
  difference: float
  low: float  # 95% confidence interval of the difference.
  high: float
  p: float  # two-sided p-value.


def welch(a: Sequence[float], b: Sequence[float]) -> Comparison:
  """Welch's t-test (unequal variances) of two samples of at least 2 values each.

  When both samples are constant the difference is exact: p = 1 if it is 0, else 0.
  """
  (mean_a, std_a), (mean_b, std_b) = mean_std(a), mean_std(b)
  difference = mean_a - mean_b
  var_a, var_b = std_a**2 / len(a), std_b**2 / len(b)  # squared standard errors
  if var_a + var_b == 0:
    return _t_test(difference, 0.0, 1.0)
  df = (var_a + var_b)**2 / (var_a**2 / (len(a) - 1) + var_b**2 / (len(b) - 1))
  return _t_test(difference, math.sqrt(var_a + var_b), df)


def paired(a: Sequence[float], b: Sequence[float]) -> Comparison:
  """Paired t-test of a[i] - b[i] (the same runs measured two ways), at least 2 pairs.

  When the differences are constant they are exact: p = 1 if they are 0, else 0.
  """
  mean, std = mean_std([x - y for x, y in zip(a, b, strict=True)])
  return _t_test(mean, std / math.sqrt(len(a)), len(a) - 1)


def _t_test(difference: float, se: float, df: float) -> Comparison:
  """The 95% interval and two-sided p of `difference` with standard error `se` on a t
  distribution of `df` degrees of freedom; with no error (se 0) the difference is exact: p = 1
  if it is 0, else 0."""
  if se == 0:
    return Comparison(difference, difference, difference, float(difference == 0))
  half_width = float(stats.t.ppf(1 - ALPHA / 2, df)) * se
  return Comparison(difference, difference - half_width, difference + half_width,
                    float(2 * stats.t.sf(abs(difference) / se, df)))


def format_p(p: float) -> str:
  """p to 2 significant digits, or more where fewer would round it across ALPHA (0.0496 reads
  0.0496 and 0.04996 reads 0.04996, not 0.05 beside a "yes")."""
  digits = 2
  while (float(text := f"{p:.{digits}g}") < ALPHA) != (p < ALPHA) and digits < 17:
    digits += 1
  return text


def judge(
    a: Sequence[float], b: Sequence[float], *, gap: bool, margin: float,
    test: Callable[[Sequence[float], Sequence[float]], Comparison] = welch) -> tuple[str, str]:
  """Verdict and statistics of a prediction about mean(a) - mean(b), from the 95% confidence
  interval [low, high] of the difference against the prediction's bound (`margin` for a gap,
  -`margin` for a match): "yes" when the whole interval lies at or above the bound, "no" when
  it lies below it, "inconclusive" when it straddles it (the seeds cannot tell either way).

  Args:
    a, b: one value per seed (by `test`: `welch` for two sets of runs, `paired` for one set
      measured two ways, a[i] and b[i] of the same run).
    gap: True predicts a above b by at least `margin`; False predicts a no worse than b by
      more than `margin` (a match).
    margin: in the values' unit.

  Returns:
    ("yes" | "no" | INCONCLUSIVE | "not enough seeds" (fewer than MIN_SEEDS values in a or b),
     "difference [95% CI], p" or "" without a test).
  """
  if min(len(a), len(b)) < MIN_SEEDS:
    return "not enough seeds", ""
  c = test(a, b)
  bound = margin if gap else -margin
  verdict = "yes" if c.low >= bound else "no" if c.high < bound else INCONCLUSIVE
  return verdict, f"{c.difference:+.1f} [{c.low:+.1f}, {c.high:+.1f}], p = {format_p(c.p)}"


def both(first: str, second: str) -> str:
  """The verdict of two predictions that must both hold: "no" if either is, "yes" if both
  are, else the first other verdict ("inconclusive", "not enough seeds")."""
  if "no" in (first, second):
    return "no"
  return "yes" if first == second == "yes" else next(v for v in (first, second) if v != "yes")


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
    (finding, verdict, evidence) triples; verdict is "yes", "no", "inconclusive" (`judge`),
    "not enough seeds",
    "not run" where the rows it needs are missing, or (5, speed) "not judged" where a run's
    steps per second were not timed alone (`timing.caveat`).
  """
  test_split = main_test_split(runs)
  bleu = lambda row, table="ablation", split=test_split: bleu_values(runs, table, row, split)
  speed = lambda row: field_values(runs, "ablation", row, "steps_per_second")
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
        evidence=lambda: f"rel_kv {format_mean_std(rel)} vs abs {format_mean_std(ab)}")
  check("2. no position information collapses quality", rel, none_, gap=True,
        evidence=lambda: f"rel_kv {format_mean_std(rel)} vs none {format_mean_std(none_)}")
  sweep = {r: bleu(r, "k_sweep") for r in rows_in_order(runs, "k_sweep")}
  k_of = lambda row: int(row.split("=")[1])
  positive = {r: v for r, v in sweep.items() if k_of(r) >= 1}
  lowest = _extreme_rows(positive)[1] if positive else None
  k0 = sweep.get("k=0", [])
  check(
      "2b. k = 0 collapses quality (below every k >= 1, within the k sweep)",
      positive.get(lowest, []), k0, gap=True,
      evidence=lambda: f"lowest k >= 1, {lowest} {format_mean_std(positive[lowest])}, "
      f"vs k=0 {format_mean_std(k0)}")
  flat = {r: v for r, v in sweep.items() if k_of(r) >= 2}
  high, low = _extreme_rows(flat) if len(flat) >= 2 else (None, None)
  check(
      "3. quality is flat for k >= 2", flat.get(low, []), flat.get(high, []), gap=False,
      evidence=lambda: f"{len(flat)} values of k; lowest {low} {format_mean_std(flat[low])} vs "
      f"highest {high} {format_mean_std(flat[high])}")
  rel_k, rel_v = bleu("rel_k"), bleu("rel_v")
  check("4a. a^K alone recovers all of it", rel_k, rel, gap=False,
        evidence=lambda: f"rel_k {format_mean_std(rel_k)} vs rel_kv {format_mean_std(rel)}")
  half = (mean_std(rel)[0] - mean_std(none_)[0]) / 2 if rel and none_ else 0.0
  finding_4b = "4b. a^V alone recovers most of it"
  evidence_4b = lambda: f"rel_v {format_mean_std(rel_v)} vs none {format_mean_std(none_)}"
  if rel and rel_v and half <= 0 and min(len(rel), len(rel_v), len(none_)) >= MIN_SEEDS:
    # A margin of half a loss would call rel_v below none "most of it".
    out.append((finding_4b, "no", f"{evidence_4b()}: rel_kv gains nothing over none "
                f"({2 * half:+.1f}) for a^V to recover"))
  else:
    check(finding_4b, rel_v, none_, gap=True, margin=half, needs=[rel],
          evidence=lambda: f"{evidence_4b()}, more than half of rel_kv's gain ({half:.1f})")
  # About SPEED_DROP: rel_kv between `slowest` and `fastest` of abs's steps/s, both shown.
  slowest, fastest = 1 - paper.SPEED_DROP - 0.05, 1 - paper.SPEED_DROP + 0.05
  s_rel, s_abs = speed("rel_kv"), speed("abs")
  speed_finding = f"5. rel_kv costs about {paper.SPEED_DROP:.0%} of steps per second"
  speed_evidence = lambda: (f"drop {1 - mean_std(s_rel)[0] / mean_std(s_abs)[0]:.1%} "
                            f"({mean_std(s_rel)[0]:.2f} vs {mean_std(s_abs)[0]:.2f} steps/s)")
  untimed = timing.untimed_runs(runs, "ablation", ("rel_kv", "abs"))
  if not (s_rel and s_abs):
    out.append((speed_finding, "not run", "–"))
  elif untimed and min(len(s_rel), len(s_abs)) >= MIN_SEEDS:
    out.append((speed_finding, "not judged", f"{speed_evidence()}, not timed alone: {untimed}"))
  else:
    not_slower = judge(s_rel, [slowest * s for s in s_abs], gap=False, margin=0.0)
    not_faster = judge([fastest * s for s in s_abs], s_rel, gap=False, margin=0.0)
    statistics = (f": rel_kv - {slowest:.0%} of abs {not_slower[1]}; {fastest:.0%} of abs - "
                  f"rel_kv {not_faster[1]}, in steps/s" if not_slower[1] else "")
    out.append((speed_finding, both(not_slower[0], not_faster[0]),
                f"{speed_evidence()}, a drop of {1 - fastest:.0%} to {1 - slowest:.0%} "
                f"predicted{statistics}"))
  long_rel, long_abs = bleu("rel_kv", split="test_long"), bleu("abs", split="test_long")
  check(
      "6. (later work) relative beats absolute on longer sentences", long_rel, long_abs, gap=True,
      evidence=lambda: f"test_long rel_kv {format_mean_std(long_rel)} vs abs "
      f"{format_mean_std(long_abs)}")
  return out


def length_findings(runs: list[dict]) -> list[tuple[str, str, str]]:
  """The length table's findings, each judged by Welch's t-test over seeds, (ii) by a paired
  one (`judge`).

  (i) each relative row beats abs on the long split (Rosendahl et al. 2019), and, where the
  runs score it, on its sentences of constructions seen in training (`LENGTH_ALONE_SUBSET`:
  length alone, apart from constructions never seen) and on LENGTH_ALONE_SPLIT; (ii) per row,
  oracle length lifts the long split (with the share of the drop it recovers); (iii) each
  intervention of `tables.LENGTH_BASES` lifts the long split over its base row, with its
  cost on the test split.

  Returns:
    (finding, verdict, evidence) triples; verdict "yes", "no", "inconclusive", "not enough
    seeds" or
    "not run".
  """
  table_runs = [r for r in runs if r["table"] == "length"]
  test_split, long = main_test_split(table_runs), long_split(table_runs)
  bleu = lambda row, split: bleu_values(runs, "length", row, split)
  out = []

  def check(finding, a, b, *, gap, evidence, after="", test=welch):
    """Judges a against b (`judge`); evidence() describes them, `after` follows the test."""
    if not (a and b):
      out.append((finding, "not run", "–"))
      return
    verdict, statistics = judge(a, b, gap=gap, margin=MARGIN_BLEU, test=test)
    out.append((finding, verdict, evidence() + (f": {statistics}" if statistics else "") + after))

  base = bleu("abs", long)
  for row in RELATIVE_LENGTH_ROWS:
    values = bleu(row, long)
    check(f"(i) {row} beats abs on {long} (Rosendahl et al. 2019)", values, base, gap=True,
          evidence=lambda: f"{row} {format_mean_std(values)} vs abs {format_mean_std(base)}")
  alone = lambda row: subset_bleu_values(runs, "length", row, long, LENGTH_ALONE_SUBSET)
  if alone("abs"):
    for row in RELATIVE_LENGTH_ROWS:
      values = alone(row)
      check(
          f"(i) {row} beats abs on {long}'s {LENGTH_ALONE_SUBSET} (length alone)", values,
          alone("abs"), gap=True, evidence=lambda: f"{row} {format_mean_std(values)} vs abs "
          f"{format_mean_std(alone('abs'))}")
  if base := bleu("abs", LENGTH_ALONE_SPLIT):
    for row in RELATIVE_LENGTH_ROWS:
      values = bleu(row, LENGTH_ALONE_SPLIT)
      check(f"(i) {row} beats abs on {LENGTH_ALONE_SPLIT} (length alone)", values, base, gap=True,
            evidence=lambda: f"{row} {format_mean_std(values)} vs abs {format_mean_std(base)}")
  for row in rows_in_order(runs, "length"):
    # The runs decoded both ways, paired run by run.
    row_runs = [r for r in runs_of_row(runs, "length", row) if long in r.get("oracle_length", {})]
    oracle = oracle_bleu(row_runs, long)
    plain = [r["scores"][long]["bleu"] for r in row_runs]
    share = recovered_shares(row_runs, test_split, long)
    check(
        f"(ii) {row}: oracle length lifts {long}", oracle, plain, gap=True, test=paired,
        evidence=lambda: (f"recovers {format_percent(share)} of the drop; oracle "
                          f"{format_mean_std(oracle)} vs {format_mean_std(plain)}, paired"))
  for row, base_row in tables.LENGTH_BASES:
    a, b = bleu(row, long), bleu(base_row, long)
    cost = _cost(bleu(row, test_split), bleu(base_row, test_split), test_split)
    check(f"(iii) {row} lifts {long} over {base_row}", a, b, gap=True,
          evidence=lambda: f"{long} {row} {format_mean_std(a)} vs {base_row} {format_mean_std(b)}",
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
  return f"{split} {c.difference:+.1f} [{c.low:+.1f}, {c.high:+.1f}], p = {format_p(c.p)}"
