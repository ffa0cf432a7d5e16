"""How a prediction about rows of a table is judged from per-seed values: mean ± sample std,
Welch's t-test of two rows (and its general form, a contrast of several), a paired t-test of
one row measured two ways, and the verdict of a prediction from its 95% interval against the
prediction's bound (`judge`). `relpos.experiments.verdicts` applies them to the paper's
findings and the length table's.

Values are lists with one entry per run (seed) of a row: [runs].
"""

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

from scipy import stats

# Significance level of the Welch's t-tests behind the findings (95% confidence intervals).
ALPHA = 0.05
# Fewer seeds per row than this and a finding gets no verdict.
MIN_SEEDS = 3
# The verdict of a prediction whose 95% confidence interval straddles its bound (`judge`).
INCONCLUSIVE = "inconclusive"
# `judge`'s rule, as the tables state it.
RULE = ("A prediction holds (yes) when the whole interval lies on its side of the prediction's "
        "bound, fails (no) when the whole interval lies on the other side, and is inconclusive "
        "when the interval straddles the bound: the seeds cannot tell. A finding about several "
        "rows holds where each of its comparisons does (the one shown decides it). p is the "
        "two-sided p of a difference of 0, not of the bound: a gap with p < 0.05 can still be "
        "inconclusive. Each interval and p is the finding's own, not corrected for the number "
        "of findings tested.")


def mean_std(values: Sequence[float]) -> tuple[float, float]:
  """Mean and sample standard deviation (0 for a single value)."""
  mean = sum(values) / len(values)
  if len(values) < 2:
    return mean, 0.0
  var = sum((v - mean)**2 for v in values) / (len(values) - 1)
  return mean, math.sqrt(var)


class Comparison(NamedTuple):
  """A t-test of mean(a) - mean(b), Welch's (`welch`) or paired (`paired`), or of a contrast of
  several means (`contrast`)."""
  difference: float
  low: float  # 95% confidence interval of the difference.
  high: float
  p: float  # two-sided p-value.


def welch(a: Sequence[float], b: Sequence[float]) -> Comparison:
  """Welch's t-test (unequal variances) of mean(a) - mean(b), samples of at least 2 values.

  When both samples are constant the difference is exact: p = 1 if it is 0, else 0.
  """
  return contrast((a, b), (1.0, -1.0))


def contrast(samples: Sequence[Sequence[float]], weights: Sequence[float]) -> Comparison:
  """A t-test of sum_i weights[i] * mean(samples[i]), each sample of at least 2 values with its
  own variance: standard error sqrt(sum_i weights[i]^2 var_i / n_i), Welch-Satterthwaite
  degrees of freedom (Welch's test is the contrast (1, -1) of two samples). Exact (p = 1 if 0,
  else 0) when every sample is constant."""
  terms = [(weight * mean_std(sample)[0], (weight * mean_std(sample)[1])**2 / len(sample),
            len(sample)) for sample, weight in zip(samples, weights, strict=True)]
  estimate, variance = sum(t[0] for t in terms), sum(t[1] for t in terms)
  if variance == 0:
    return _t_test(estimate, 0.0, 1.0)
  df = variance**2 / sum(v**2 / (n - 1) for _, v, n in terms if v)
  return _t_test(estimate, math.sqrt(variance), df)


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
  0.0496 and 0.04996 reads 0.04996, not 0.05)."""
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
  return verdict_of(test(a, b), margin if gap else -margin)


def verdict_of(c: Comparison, bound: float) -> tuple[str, str]:
  """`judge`'s verdict and statistics of comparison `c` against `bound`."""
  verdict = "yes" if c.low >= bound else "no" if c.high < bound else INCONCLUSIVE
  return verdict, describe(c, bound)


def describe(c: Comparison, bound: float | None = None) -> str:
  """"difference [95% CI], p = p" of comparison `c`, to 0.1 BLEU; with a verdict's `bound`, an
  interval end within rounding of it keeps the digits that place it (`_interval_end`)."""
  interval = f"[{_interval_end(c.low, bound)}, {_interval_end(c.high, bound)}]"
  return f"{c.difference:+.1f} {interval}, p = {format_p(c.p)}"


def _interval_end(end: float, bound: float | None) -> str:
  """An interval's end to 0.1, or to more digits where 0.1 would put it on or across the
  verdict's bound (0.96 against a bound of 1 reads +0.96, not +1.0 beside "inconclusive")."""
  digits = 1
  while bound is not None and digits < 6:
    shown = float(f"{end:.{digits}f}")
    if (shown >= bound) == (end >= bound) and (shown != bound or end == bound):
      break
    digits += 1
  return f"{end:+.{digits}f}"


def judge_each(pairs: Sequence[tuple[str, Sequence[float], Sequence[float]]], *, gap: bool,
               margin: float) -> tuple[str, str]:
  """The verdict of a prediction that must hold for each pair (name, a, b) (`judge`): "no"
  where one fails, "yes" where all hold, else the first other verdict; with the name and
  statistics of the pair that decides it: of those that fail, else of those not shown, else of
  all, the one whose interval reaches furthest past (or nearest to) the bound."""
  if any(min(len(a), len(b)) < MIN_SEEDS for _, a, b in pairs):
    return "not enough seeds", ""
  bound = margin if gap else -margin
  tests = [(name, welch(a, b)) for name, a, b in pairs]
  judged = [(name, *verdict_of(c, bound), c.low) for name, c in tests]
  verdict = "yes"
  for _, each, _, _ in judged:
    verdict = both(verdict, each)
  deciding = min(judged, key=lambda j: (j[1] != "no", j[1] == "yes", j[3]))
  return verdict, f"{deciding[0]}: {deciding[2]}"


def both(first: str, second: str) -> str:
  """The verdict of two predictions that must both hold: "no" if either is, "yes" if both
  are, else the first other verdict ("inconclusive", "not enough seeds")."""
  if "no" in (first, second):
    return "no"
  return "yes" if first == second == "yes" else next(v for v in (first, second) if v != "yes")
