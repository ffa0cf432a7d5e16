"""Tests for relpos.experiments.verdicts: the findings' verdicts over seeds (the tests behind
them: test_experiments_significance.py)."""

from scipy import stats

from relpos.data import synthetic
from relpos.experiments import report_length
from relpos.experiments import verdicts
import fake_results


def _seeded(table, row, tests, *, k=None, longs=(30.0, 30.0, 30.0), speeds=(10.0, 10.0, 10.0)):
  return [
      fake_results.run_record(table, row, seed, test, long, k=k, speed=speed)
      for seed, (test, long, speed) in enumerate(zip(tests, longs, speeds))
  ]


def test_findings_verdicts_with_three_seeds():
  runs = (_seeded("ablation", "abs", [50.0, 51.0, 52.0], longs=[10.0, 11.0, 12.0]) + _seeded(
      "ablation", "rel_kv", [60.0, 61.0, 62.0], longs=[40.0, 41.0, 42.0], speeds=[9.3, 9.35, 9.4]) +
          _seeded("ablation", "none", [20.0, 21.0, 22.0]) +
          _seeded("ablation", "rel_k", [62.0, 62.5, 63.0]) +
          _seeded("ablation", "rel_v", [30.0, 31.0, 32.0]) +
          _seeded("k_sweep", "k=0", [20.0, 21.0, 22.0], k=0) +
          _seeded("k_sweep", "k=1", [50.0, 51.0, 52.0], k=1) +
          _seeded("k_sweep", "k=2", [58.0, 60.0, 62.0], k=2) +
          _seeded("k_sweep", "k=4", [59.0, 61.0, 63.0], k=4) +
          _seeded("k_sweep", "k=16", [57.0, 59.0, 61.0], k=16))
  found = {f.split(" ")[0]: (v, e) for f, v, e in verdicts.findings(runs)}
  assert {n: v for n, (v, _) in found.items()} == {
      "1.": "yes",  # 61 vs 51
      "2.": "yes",  # 61 vs none 21
      "2b.": "yes",  # within the sweep: k=1 (51, the lowest k >= 1) vs k=0 (21)
      "3.": "inconclusive",  # 59 vs 61 with std 2: -2.0 [-6.5, +2.5] straddles -1
      "4a.": "yes",  # rel_k 62.5 ± 0.5 vs 61 ± 1: +1.5 [-0.6, +3.6], all above -1
      "4b.": "no",  # rel_v 31: less than half way from 21 to 61
      "5.": "yes",  # a 6.5% drop, shown between 2% and 12%
      "6.": "yes",  # test_long 41 vs 11
  }
  # Every k >= 1 against k=0, shown by the one nearest its bound; every pair of k >= 2, shown
  # by the first that is not "yes" (the widest miss first).
  assert found["2b."][1].startswith("4 values of k >= 1 vs k=0 21.0 ± 1.0; k=1 - k=0: +30.0 [")
  assert found["3."][1].startswith("3 values of k (k=16 lowest, k=4 highest), 3 pairs; "
                                   "k=16 - k=4: -2.0 [")
  assert found["4b."][1].startswith("rel_v 31.0 ± 1.0 vs the midpoint of rel_kv 61.0 ± 1.0 and "
                                    "none 21.0 ± 1.0: -10.0 [")
  # A significant step between two values of k is not flat; one value of k gives no verdict.
  steep = [r for r in runs if r["row"] != "k=16"] + _seeded("k_sweep", "k=16", [40.0, 40.5, 41.0],
                                                            k=16)
  assert dict((f.split(" ")[0], v) for f, v, _ in verdicts.findings(steep))["3."] == "no"
  single = [r for r in runs if r["row"] not in ("k=4", "k=16")]
  assert dict((f.split(" ")[0], v) for f, v, _ in verdicts.findings(single))["3."] == "not run"
  without_k0 = {
      f.split(" ")[0]: v for f, v, _ in verdicts.findings([r for r in runs if r["row"] != "k=0"])
  }
  assert without_k0["2b."] == "not run" and without_k0["3."] == "inconclusive"


def test_a_v_alone_recovers_nothing_where_rel_kv_gains_nothing():
  """With rel_kv below none, rel_v above the midpoint of the two is not "most of the gain":
  there is none to recover."""
  runs = (_seeded("ablation", "rel_kv", [20.0, 21.0, 22.0]) +
          _seeded("ablation", "none", [30.0, 31.0, 32.0]) +
          _seeded("ablation", "rel_v", [27.0, 28.0, 29.0]))
  found = {f.split(" ")[0]: (v, e) for f, v, e in verdicts.findings(runs)}
  assert found["4b."] == (
      "no", "rel_v 28.0 ± 1.0 vs the midpoint of rel_kv 21.0 ± 1.0 and none 31.0 ± 1.0: +2.0 "
      "[+0.04, +4.0], p = 0.047; rel_kv over none, a gain to recover: -10.0 [-12.3, -7.7], "
      "p = 0.00026 (no)")


def test_a_noisy_row_is_judged_not_only_the_rows_of_extreme_means():
  """2b and 3 are about every k, not the lowest- and highest-mean rows alone: a noisy row of a
  middle mean can leave them unshown."""
  runs = (_seeded("k_sweep", "k=0", [90.0, 90.5, 89.5], k=0) +
          _seeded("k_sweep", "k=1", [96.0, 96.2, 95.8], k=1) +
          _seeded("k_sweep", "k=2", [98.0, 98.1, 97.9], k=2) +
          _seeded("k_sweep", "k=4", [97.5, 97.6, 97.4], k=4) +
          _seeded("k_sweep", "k=64", [90.5, 99.9, 99.6], k=64))
  found = {f.split(" ")[0]: (v, e) for f, v, e in verdicts.findings(runs)}
  # k=1 - k=0 is +6.0 [+4.9, +7.1], but k=64 - k=0 straddles +1.
  assert found["2b."][0] == "inconclusive" and "; k=64 - k=0: +6.7 [" in found["2b."][1]
  # k=4 - k=2 is -0.5 [-0.7, -0.3], but k=64's spread leaves its pairs unshown.
  assert found["3."][0] == "inconclusive" and "; k=64 - k=2: " in found["3."][1]


def test_a_v_alone_is_judged_with_the_spread_of_all_three_rows():
  """rel_v far above a midpoint that rel_kv's spread leaves uncertain is not shown above it."""
  runs = (_seeded("ablation", "rel_v", [70.0, 71.0, 69.0]) +
          _seeded("ablation", "rel_kv", [60.0, 98.0, 80.0]) +
          _seeded("ablation", "none", [37.0, 37.5, 36.5]))
  verdict, evidence = {f.split(" ")[0]: (v, e) for f, v, e in verdicts.findings(runs)}["4b."]
  assert verdict == "inconclusive" and evidence.startswith(
      "rel_v 70.0 ± 1.0 vs the midpoint of rel_kv 79.3 ± 19.0 and none 37.0 ± 0.5: +11.8 [-11.4, ")


def test_evidence_from_some_of_a_rows_runs_says_how_many():
  runs = (_seeded("ablation", "abs", [50.0, 51.0, 52.0], longs=[10.0, 11.0, 12.0]) +
          _seeded("ablation", "rel_kv", [60.0, 61.0, 62.0], longs=[40.0, 41.0, 42.0]) +
          [fake_results.run_record("ablation", "abs", 3, 51.0, 11.0)])
  del runs[-1]["scores"]["test_long"]  # scored before test_long existed
  found = {f.split(" ")[0]: (v, e) for f, v, e in verdicts.findings(runs)}
  assert found["6."][1].startswith("test_long rel_kv 41.0 ± 1.0 vs abs 11.0 ± 1.0 (3 of 4 runs)")
  assert found["1."][1].startswith("rel_kv 61.0 ± 1.0 vs abs 51.0 ± 0.8:")


def test_speed_is_judged_only_on_runs_timed_alone():
  runs = (_seeded("ablation", "abs", [50.0, 51.0, 52.0]) +
          _seeded("ablation", "rel_kv", [60.0, 61.0, 62.0], speeds=[5.0, 5.1, 5.2]))
  found = {f.split(" ")[0]: (v, e) for f, v, e in verdicts.findings(runs)}
  assert found["5."][0] == "no"  # a 49% drop, timed alone
  runs[4]["machine_load"] = {**runs[4]["machine_load"], "loaded_share": 0.4}
  runs[0]["machine_load"] = None
  found = {f.split(" ")[0]: (v, e) for f, v, e in verdicts.findings(runs)}
  assert found["5."] == ("not judged", "drop 49.0% (5.10 vs 10.00 steps/s), not timed alone: "
                         "load not recorded (abs seed 0); machine loaded (rel_kv seed 1)")
  assert found["1."][0] == "yes"  # quality findings do not depend on the load


def test_findings_need_three_seeds():
  found = {f.split(" ")[0]: (v, e) for f, v, e in verdicts.findings(fake_results.few_seeds())}
  assert found["1."] == ("not enough seeds", "rel_kv 61.0 ± 1.4 vs abs 51.0 ± 1.4")
  assert {v for v, _ in found.values()} == {"not enough seeds"}


def test_findings_not_run_when_rows_missing():
  runs = [fake_results.run_record("ablation", "abs", 0, 50.0, 10.0)]
  judged = {f.split(" ")[0]: v for f, v, _ in verdicts.findings(runs)}
  assert set(judged.values()) == {"not run"}


def test_length_findings_judged_by_welch_and_oracle_length_paired():
  found = {f: (v, e) for f, v, e in verdicts.length_findings(fake_results.length_runs())}
  # (i) rel_kv (25, 27, 29) against abs (28, 29, 30): an interval across +1 BLEU.
  verdict, evidence = found["(i) rel_kv beats abs on test_long (Rosendahl et al. 2019)"]
  p = stats.ttest_ind([25.0, 27.0, 29.0], [28.0, 29.0, 30.0], equal_var=False).pvalue
  assert verdict == "inconclusive" and evidence.endswith(f"p = {p:.2g}")
  assert found["(i) t5 beats abs on test_long (Rosendahl et al. 2019)"][0] == "not run"
  # (ii) abs: oracle 62-64 vs 28-30, run by run +34 exactly (paired: no spread): yes, half of
  # the drop recovered; rel_kv: +0.5 only.
  assert found["(ii) abs: oracle length lifts test_long"] == (
      "yes", "recovers 50% ± 0% of the drop; oracle 63.0 ± 1.0 vs 29.0 ± 1.0, paired: "
      "+34.0 [+34.0, +34.0], p = 0")
  assert found["(ii) rel_kv: oracle length lifts test_long"][0] == "no"
  # (iii) shape over abs: +12 on test_long at a cost of 6 on test.
  verdict, evidence = found["(iii) shape lifts test_long over abs"]
  assert verdict == "yes"
  p = stats.ttest_ind([40.0, 41.0, 42.0], [28.0, 29.0, 30.0], equal_var=False).pvalue
  cost = stats.ttest_ind([90.0, 91.0, 92.0], [96.0, 97.0, 98.0], equal_var=False).pvalue
  assert evidence == (f"test_long shape 41.0 ± 1.0 vs abs 29.0 ± 1.0: +12.0 [+9.7, +14.3], "
                      f"p = {p:.2g}; change on test -6.0 [-8.3, -3.7], p = {cost:.2g}")
  assert found["(iii) rel_kv_concat lifts test_long over rel_kv"][0] == "inconclusive"  # +1 ± 4
  assert found["(iii) fire lifts test_long over t5"][0] == "not run"
  two_seeds = [r for r in fake_results.length_runs() if r["seed"] < 2]
  assert {v for f, v, _ in verdicts.length_findings(two_seeds)} <= {"not enough seeds", "not run"}


def test_length_finding_i_is_also_judged_on_length_alone_where_runs_score_it():
  """(i) again on test_long's sentences of constructions seen in training, by Welch's t-test
  of their BLEU; not for runs scored before the subsets existed."""
  runs = fake_results.length_runs()
  for run in runs:  # rel_kv 12 BLEU above abs on the seen constructions (abs: 58, 59, 60)
    if run["row"] == "rel_kv":
      run["scores"]["test_long"]["bleu_by_subset"]["seen constructions"][
          "bleu"] = 70.0 + run["seed"]
  found = {f: (v, e) for f, v, e in verdicts.length_findings(runs)}
  verdict, evidence = found["(i) rel_kv beats abs on test_long's seen constructions (length "
                            "alone)"]
  p = stats.ttest_ind([70.0, 71.0, 72.0], [58.0, 59.0, 60.0], equal_var=False).pvalue
  assert verdict == "yes" and evidence == (f"rel_kv 71.0 ± 1.0 vs abs 59.0 ± 1.0: +12.0 [+9.7, "
                                           f"+14.3], p = {p:.2g}")
  assert found["(i) t5 beats abs on test_long's seen constructions (length alone)"][0] == "not run"
  for run in runs:
    del run["scores"]["test_long"]["bleu_by_subset"]
  assert not [f for f, _, _ in verdicts.length_findings(runs) if "length alone" in f]


def test_length_finding_i_is_judged_on_the_length_alone_split_where_runs_have_it():
  """(i) again on test_long_seen, the synthetic task's split of long sentences of seen
  constructions only, by Welch's t-test; in the length table as a column beside test_long."""
  runs = fake_results.length_runs()
  for run in runs:  # rel_kv 8 BLEU above abs (abs: 60, 61, 62); rope not run
    if run["row"] in ("abs", "rel_kv"):
      run["scores"]["test_long_seen"] = {"bleu": 60.0 + run["seed"] + 8 * (run["row"] != "abs")}
  found = {f: (v, e) for f, v, e in verdicts.length_findings(runs)}
  p = stats.ttest_ind([68.0, 69.0, 70.0], [60.0, 61.0, 62.0], equal_var=False).pvalue
  assert found["(i) rel_kv beats abs on test_long_seen (length alone)"] == (
      "yes", f"rel_kv 69.0 ± 1.0 vs abs 61.0 ± 1.0: +8.0 [+5.7, +10.3], p = {p:.2g}")
  assert found["(i) rope beats abs on test_long_seen (length alone)"][0] == "not run"
  table = report_length.length_table_lines(runs, ["abs", "rel_kv", "shape"])
  assert table[0].startswith("| row | seeds | test BLEU | test_long BLEU | test_long_seen BLEU | "
                             "test_long BLEU (oracle length) |")
  assert table[3].startswith("| rel_kv | 3 | 98.0 ± 1.0 | 27.0 ± 2.0 | 69.0 ± 1.0 | ")
  assert table[4].startswith("| shape | 3 | 91.0 ± 1.0 | 41.0 ± 1.0 | – | ")
  for run in runs:
    run["scores"].pop("test_long_seen", None)
  assert not [f for f, _, _ in verdicts.length_findings(runs) if "test_long_seen" in f]


def test_the_length_alone_subset_is_the_synthetic_tasks():
  assert verdicts.LENGTH_ALONE_SUBSET == synthetic.SEEN_CONSTRUCTIONS


def test_a_mean_of_some_of_a_rows_runs_says_how_many():
  assert verdicts.format_mean_std_of([40.0, 42.0], 3) == "41.0 ± 1.4 (2 of 3 runs)"
  assert verdicts.format_mean_std_of([40.0, 42.0, 41.0], 3) == "41.0 ± 1.0"
  assert verdicts.format_mean_std_of([], 3) == "–"


def test_a_drop_under_the_margin_has_no_recovered_share():
  """A 0.1 BLEU drop would make a 1 BLEU oracle gain read as 1,000% recovered."""
  runs = [r for r in fake_results.length_runs() if r["row"] == "abs"]
  assert verdicts.recovered_shares(runs, "test", "test_long") == [0.5, 0.5, 0.5]
  runs[0]["scores"]["test"]["bleu"] = runs[0]["scores"]["test_long"]["bleu"] + 0.1
  assert verdicts.recovered_shares(runs, "test", "test_long") == [0.5, 0.5]
