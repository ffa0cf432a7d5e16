"""Tests for relpos.experiments.significance: mean ± std, Welch's and paired t-tests, contrasts
of several rows, and the verdict of a prediction from its interval against its bound."""

import math
import statistics

import pytest
from scipy import stats

from relpos.experiments import significance


def test_mean_std():
  assert significance.mean_std([1.0]) == (1.0, 0.0)
  mean, std = significance.mean_std([1.0, 3.0])
  assert mean == 2.0 and std == pytest.approx(2**0.5)


def test_welch_against_the_closed_form():
  # Equal sizes and variances: df = 2 (n - 1) = 4, where P(|T| < t) = x (3 - x^2) / 2 with
  # x = t / sqrt(t^2 + 4), and the 97.5% quantile is 2.776445.
  c = significance.welch([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])
  se = math.sqrt(1 / 3 + 1 / 3)
  x = 3 / se / math.sqrt((3 / se)**2 + 4)
  assert c.difference == -3.0
  assert c.p == pytest.approx(1 - x * (3 - x * x) / 2, rel=1e-6)
  assert (c.low, c.high) == pytest.approx((-3 - 2.776445 * se, -3 + 2.776445 * se), rel=1e-6)
  assert significance.welch([5.0, 5.0, 5.0], [5.0, 5.0, 5.0]).p == 1.0  # constant samples: exact
  assert significance.welch([6.0, 6.0, 6.0], [5.0, 5.0, 5.0]) == (1.0, 1.0, 1.0, 0.0)


def test_judge_reads_the_confidence_interval_against_the_bound():
  noisy_high, noisy_low = [97.0, 99.0, 101.0], [95.0, 97.0, 99.0]  # 2 BLEU apart, std 2
  verdict, statistics = significance.judge(noisy_high, noisy_low, gap=True, margin=1.0)
  assert verdict == "inconclusive" and statistics.startswith("+2.0 [-2.5, +6.5], p = ")
  assert significance.judge(noisy_low, noisy_high, gap=False, margin=1.0)[0] == "inconclusive"
  tight_high, tight_low = [99.0, 99.1, 99.2], [96.0, 96.1, 96.2]
  assert significance.judge(tight_high, tight_low, gap=True, margin=1.0)[0] == "yes"  # [+2.8, +3.2]
  assert significance.judge(tight_high, tight_low, gap=True, margin=4.0)[0] == "no"  # all below 4
  verdict, statistics = significance.judge(tight_low, tight_high, gap=False, margin=1.0)
  assert verdict == "no" and statistics.startswith("-3.0 [-3.2, -2.8], p = ")
  # A match holds when the whole interval lies above -margin, though not significant vs 0.
  assert significance.judge([96.0, 96.2, 96.4], [96.1, 96.3, 96.5], gap=False,
                            margin=1.0)[0] == "yes"
  assert significance.judge(tight_low[:2], tight_high, gap=False,
                            margin=1.0) == ("not enough seeds", "")


def test_both_predictions_must_hold():
  assert significance.both("yes", "yes") == "yes"
  assert significance.both("yes", "no") == significance.both("inconclusive", "no") == "no"
  assert significance.both("yes", "inconclusive") == significance.both("inconclusive",
                                                                       "yes") == "inconclusive"
  assert significance.both("not enough seeds", "not enough seeds") == "not enough seeds"


def test_paired_t_test_against_scipy():
  """One row decoded two ways: the runs' differences, not two independent samples."""
  a, b = [30.0, 27.5, 33.0, 29.0], [28.0, 26.0, 30.5, 28.0]
  c = significance.paired(a, b)
  expected = stats.ttest_rel(a, b)
  interval = expected.confidence_interval(0.95)
  assert (c.difference, c.low, c.high, c.p) == pytest.approx(
      (1.75, interval.low, interval.high, expected.pvalue))
  assert c.p < significance.welch(a, b).p  # the spread between runs cancels
  assert significance.paired([2.0, 3.0], [1.0, 2.0]) == (1.0, 1.0, 1.0, 0.0)
  assert significance.paired([2.0, 3.0], [2.0, 3.0]) == (0.0, 0.0, 0.0, 1.0)
  with pytest.raises(ValueError):
    significance.paired([1.0, 2.0, 3.0], [1.0, 2.0])


def test_p_values_never_round_across_the_significance_level():
  assert significance.format_p(0.0496) == "0.0496"  # 0.05 would read as not below it
  assert significance.format_p(0.04996) == "0.04996" and significance.format_p(
      0.049951) == "0.04995"
  assert significance.format_p(0.0504) == "0.05"  # not below the level, as its p
  assert significance.format_p(0.062) == "0.062" and significance.format_p(6.6e-05) == "6.6e-05"
  assert significance.format_p(0.5) == "0.5" and significance.format_p(1.0) == "1"


def test_a_contrast_of_three_rows_against_welch_satterthwaite():
  a, b, c = [70.0, 71.0, 69.0], [60.0, 98.0, 80.0], [37.0, 37.5, 36.5]
  result = significance.contrast((a, b, c), (1.0, -0.5, -0.5))
  weights = (1.0, -0.5, -0.5)
  variances = [w**2 * statistics.variance(x) / 3 for w, x in zip(weights, (a, b, c))]
  se = math.sqrt(sum(variances))
  df = sum(variances)**2 / sum(v**2 / 2 for v in variances)  # Welch-Satterthwaite, n - 1 = 2
  estimate = statistics.mean(a) - (statistics.mean(b) + statistics.mean(c)) / 2
  half_width = stats.t.ppf(0.975, df) * se
  assert result.difference == pytest.approx(estimate)
  assert (result.low, result.high) == pytest.approx((estimate - half_width, estimate + half_width))
  assert result.p == pytest.approx(2 * stats.t.sf(abs(estimate) / se, df))
  assert result.low < 0 < result.high  # rel_kv's spread enters: inconclusive, not "yes"
  assert significance.contrast(([5.0, 5.0], [3.0, 3.0]), (1.0, -1.0)) == (2.0, 2.0, 2.0, 0.0)


def test_an_interval_end_near_the_bound_keeps_the_digits_that_place_it():
  just_under = significance.Comparison(3.0, 0.96, 5.04, 0.01)
  assert significance.verdict_of(just_under,
                                 1.0) == ("inconclusive", "+3.0 [+0.96, +5.0], p = 0.01")
  just_over = significance.Comparison(3.6, 1.044, 6.2, 0.01)
  assert significance.verdict_of(just_over, 1.0) == ("yes", "+3.6 [+1.04, +6.2], p = 0.01")
  assert significance.verdict_of(significance.Comparison(-2.7, -6.4, 1.008, 0.1),
                                 1.0)[1] == "-2.7 [-6.4, +1.01], p = 0.1"
  assert significance.verdict_of(significance.Comparison(2.0, 1.0, 3.0, 0.01), 1.0)[0] == "yes"


def test_a_comparison_without_a_bound_reads_to_a_tenth():
  c = significance.Comparison(3.0, 0.96, 5.04, 0.0123)
  assert significance.describe(c) == "+3.0 [+1.0, +5.0], p = 0.012"
  assert significance.describe(c, 1.0) == "+3.0 [+0.96, +5.0], p = 0.012"


def test_a_prediction_about_each_pair_holds_only_where_every_pair_does():
  tight = lambda m: [m - 0.1, m, m + 0.1]
  noisy = [95.8, 99.8, 97.9]
  pairs = [("k=4 - k=2", tight(97.5), tight(98.0)), ("k=16 - k=2", noisy, tight(98.0))]
  verdict, statistics = significance.judge_each(pairs, gap=False, margin=1.0)
  assert verdict == "inconclusive" and statistics.startswith("k=16 - k=2: -0.2 [")
  assert significance.judge_each(pairs[:1], gap=False, margin=1.0)[0] == "yes"
  failing = pairs + [("k=64 - k=2", tight(90.0), tight(98.0))]
  verdict, statistics = significance.judge_each(failing, gap=False, margin=1.0)
  assert verdict == "no" and statistics.startswith("k=64 - k=2: -8.0 [")
  assert significance.judge_each([("a - b", [1.0, 2.0], [1.0, 2.0, 3.0])], gap=True,
                                 margin=1.0) == ("not enough seeds", "")
