"""The numbers and verdicts behind `table.md`, from the runs of `results.json`
(`relpos.experiments.report.load_runs`): each row's per-seed values, their mean ± sample std,
Welch's t-test of two rows (a paired one of one row decoded two ways), and the verdicts on
the paper's findings (`findings`) and on the length table's (`length_findings`).
`relpos.experiments.report` lays them out as markdown.

Values are lists with one entry per run (seed) of a (table, row): [runs].
"""

from collections.abc import Callable, Sequence

from relpos.experiments import paper
from relpos.experiments import significance
from relpos.experiments import tables
from relpos.experiments import timing

# A predicted gap must be at least this many BLEU; a predicted match may miss by this much.
MARGIN_BLEU = 1.0
# The synthetic task's test_long sentences built only of constructions seen in training
# (`relpos.data.synthetic.SEEN_CONSTRUCTIONS`, a subset of `bleu_by_subset`): length alone.
LENGTH_ALONE_SUBSET = "seen constructions"
# Its split of its own, of test_long's lengths (`task.synthetic.num_test_long_seen` sentences).
LENGTH_ALONE_SPLIT = "test_long_seen"
# The relative rows finding (i) of the length table sets against abs.
RELATIVE_LENGTH_ROWS = ("rel_kv", "t5", "rope", "alibi", "fire")


def format_mean_std(values: Sequence[float]) -> str:
  """"mean ± std" of values [n] to 0.1 ("mean" alone for one value, "–" for none)."""
  if not values:
    return "–"
  mean, std = significance.mean_std(values)
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
  mean, std = significance.mean_std(values)
  return f"{100 * mean:.0f}% ± {100 * std:.0f}%" if len(values) > 1 else f"{100 * mean:.0f}%"


def format_ratio(values: Sequence[float]) -> str:
  """"mean ± std" of values [n] to 0.01 ("mean" alone for one value, "–" for none)."""
  if not values:
    return "–"
  mean, std = significance.mean_std(values)
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


def findings(runs: list[dict]) -> list[tuple[str, str, str]]:
  """Checks each of the paper's findings against the runs, with the spread over seeds.

  Every finding compares sets of per-seed values by Welch's t-test (see `judge`): 2b each
  k >= 1 against k=0, 3 each pair of k >= 2 (two values of k at least), 4b rel_v against the
  midpoint of rel_kv and none (a contrast of three rows) with rel_kv above none; the k-sweep
  findings compare rows of the k sweep only. A value from some of a row's runs says how many.

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

  def shown(row: str, values: list[float], table: str = "ablation") -> str:
    """`row values` as evidence: mean ± std, with how many of the row's runs they come from
    when not all."""
    return f"{row} {format_mean_std_of(values, len(runs_of_row(runs, table, row)))}"

  def check(finding, a, b, *, gap, margin=MARGIN_BLEU, evidence):
    """Judges the finding on values a against b (see `judge`); evidence() describes them."""
    if not (a and b):
      out.append((finding, "not run", "–"))
      return
    verdict, statistics = significance.judge(a, b, gap=gap, margin=margin)
    out.append((finding, verdict, evidence() + (f": {statistics}" if statistics else "")))

  def check_each(finding, pairs, *, gap, evidence):
    """Judges the finding on each (name, a, b) of `pairs` (see `judge_each`); evidence()
    describes them. "not run" when there is no pair."""
    if not pairs:
      out.append((finding, "not run", "–"))
      return
    verdict, statistics = significance.judge_each(pairs, gap=gap, margin=MARGIN_BLEU)
    out.append((finding, verdict, evidence() + (f"; {statistics}" if statistics else "")))

  rel, ab, none_ = bleu("rel_kv"), bleu("abs"), bleu("none")
  check(f"1. relative matches or beats absolute ({test_split} BLEU)", rel, ab, gap=False,
        evidence=lambda: f"{shown('rel_kv', rel)} vs {shown('abs', ab)}")
  check("2. no position information collapses quality", rel, none_, gap=True,
        evidence=lambda: f"{shown('rel_kv', rel)} vs {shown('none', none_)}")
  sweep = {r: bleu(r, "k_sweep") for r in rows_in_order(runs, "k_sweep")}
  k_of = lambda row: int(row.split("=")[1])
  k0 = sweep.get("k=0", [])
  positive = [(f"{r} - k=0", v, k0) for r, v in sweep.items() if k_of(r) >= 1 and v and k0]
  check_each(
      "2b. k = 0 collapses quality (below every k >= 1, within the k sweep)", positive, gap=True,
      evidence=lambda: f"{len(positive)} values of k >= 1 vs "
      f"{shown('k=0', k0, 'k_sweep')}")
  # Each pair of k >= 2, lower mean first: within MARGIN_BLEU both ways (a symmetric interval
  # of lower - higher at or above -MARGIN_BLEU ends at or below +MARGIN_BLEU).
  flat = sorted(((r, v) for r, v in sweep.items() if k_of(r) >= 2 and v),
                key=lambda item: significance.mean_std(item[1])[0])
  pairs = [(f"{a} - {b}", va, vb) for i, (a, va) in enumerate(flat) for b, vb in flat[i + 1:]]
  check_each(
      "3. quality is flat for k >= 2", pairs, gap=False,
      evidence=lambda: f"{len(flat)} values of k ({flat[0][0]} lowest, {flat[-1][0]} "
      f"highest), {len(pairs)} pairs")
  rel_k, rel_v = bleu("rel_k"), bleu("rel_v")
  check("4a. a^K alone recovers all of it", rel_k, rel, gap=False,
        evidence=lambda: f"{shown('rel_k', rel_k)} vs {shown('rel_kv', rel)}")
  out.append(_most_of_the_gain(rel_v, rel, none_, shown))
  # About SPEED_DROP: rel_kv between `slowest` and `fastest` of abs's steps/s, both shown.
  slowest, fastest = 1 - paper.SPEED_DROP - 0.05, 1 - paper.SPEED_DROP + 0.05
  s_rel, s_abs = speed("rel_kv"), speed("abs")
  speed_finding = f"5. rel_kv costs about {paper.SPEED_DROP:.0%} of steps per second"
  mean = lambda values: significance.mean_std(values)[0]
  speed_evidence = lambda: (f"drop {1 - mean(s_rel) / mean(s_abs):.1%} ({mean(s_rel):.2f} vs "
                            f"{mean(s_abs):.2f} steps/s)")
  untimed = timing.untimed_runs(runs, "ablation", ("rel_kv", "abs"))
  if not (s_rel and s_abs):
    out.append((speed_finding, "not run", "–"))
  elif untimed and min(len(s_rel), len(s_abs)) >= significance.MIN_SEEDS:
    out.append((speed_finding, "not judged", f"{speed_evidence()}, not timed alone: {untimed}"))
  else:
    not_slower = significance.judge(s_rel, [slowest * s for s in s_abs], gap=False, margin=0.0)
    not_faster = significance.judge([fastest * s for s in s_abs], s_rel, gap=False, margin=0.0)
    statistics = (f": rel_kv - {slowest:.0%} of abs {not_slower[1]}; {fastest:.0%} of abs - "
                  f"rel_kv {not_faster[1]}, in steps/s" if not_slower[1] else "")
    out.append((speed_finding, significance.both(not_slower[0], not_faster[0]),
                f"{speed_evidence()}, a drop of {1 - fastest:.0%} to {1 - slowest:.0%} "
                f"predicted{statistics}"))
  long_rel, long_abs = bleu("rel_kv", split="test_long"), bleu("abs", split="test_long")
  check("6. (later work) relative beats absolute on longer sentences", long_rel, long_abs, gap=True,
        evidence=lambda: f"test_long {shown('rel_kv', long_rel)} vs "
        f"{shown('abs', long_abs)}")
  return out


def _most_of_the_gain(rel_v: list[float], rel: list[float], none_: list[float],
                      shown: Callable[[str, list[float]], str]) -> tuple[str, str, str]:
  """Finding 4b: a^V alone recovers most of rel_kv's gain over none: the contrast rel_v -
  (rel_kv + none) / 2 above 0 (its variance from all three rows), and rel_kv above none (a
  gain to recover)."""
  finding = "4b. a^V alone recovers most of it"
  if not (rel_v and rel and none_):
    return finding, "not run", "–"
  evidence = (f"{shown('rel_v', rel_v)} vs the midpoint of {shown('rel_kv', rel)} and "
              f"{shown('none', none_)}")
  if min(len(rel_v), len(rel), len(none_)) < significance.MIN_SEEDS:
    return finding, "not enough seeds", evidence
  above_midpoint, statistics = significance.verdict_of(
      significance.contrast((rel_v, rel, none_), (1.0, -0.5, -0.5)), 0.0)
  gain, gain_statistics = significance.judge(rel, none_, gap=True, margin=0.0)
  if gain != "yes":
    statistics += f"; rel_kv over none, a gain to recover: {gain_statistics} ({gain})"
  return finding, significance.both(above_midpoint, gain), f"{evidence}: {statistics}"


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

  def check(finding, a, b, *, gap, evidence, after="", test=significance.welch):
    """Judges a against b (`judge`); evidence() describes them, `after` follows the test."""
    if not (a and b):
      out.append((finding, "not run", "–"))
      return
    verdict, statistics = significance.judge(a, b, gap=gap, margin=MARGIN_BLEU, test=test)
    out.append((finding, verdict, evidence() + (f": {statistics}" if statistics else "") + after))

  def shown(row: str, values: list[float]) -> str:
    """`row values` as evidence, saying how many of the row's runs they come from if not all."""
    return f"{row} {format_mean_std_of(values, len(runs_of_row(runs, 'length', row)))}"

  base = bleu("abs", long)
  for row in RELATIVE_LENGTH_ROWS:
    values = bleu(row, long)
    check(f"(i) {row} beats abs on {long} (Rosendahl et al. 2019)", values, base, gap=True,
          evidence=lambda: f"{shown(row, values)} vs {shown('abs', base)}")
  alone = lambda row: subset_bleu_values(runs, "length", row, long, LENGTH_ALONE_SUBSET)
  if alone("abs"):
    for row in RELATIVE_LENGTH_ROWS:
      values = alone(row)
      check(f"(i) {row} beats abs on {long}'s {LENGTH_ALONE_SUBSET} (length alone)", values,
            alone("abs"), gap=True,
            evidence=lambda: f"{shown(row, values)} vs {shown('abs', alone('abs'))}")
  if base := bleu("abs", LENGTH_ALONE_SPLIT):
    for row in RELATIVE_LENGTH_ROWS:
      values = bleu(row, LENGTH_ALONE_SPLIT)
      check(f"(i) {row} beats abs on {LENGTH_ALONE_SPLIT} (length alone)", values, base, gap=True,
            evidence=lambda: f"{shown(row, values)} vs {shown('abs', base)}")
  for row in rows_in_order(runs, "length"):
    # The runs decoded both ways, paired run by run.
    row_runs = [r for r in runs_of_row(runs, "length", row) if long in r.get("oracle_length", {})]
    oracle = oracle_bleu(row_runs, long)
    plain = [r["scores"][long]["bleu"] for r in row_runs]
    share = recovered_shares(row_runs, test_split, long)
    num_runs = len(runs_of_row(runs, "length", row))
    check(
        f"(ii) {row}: oracle length lifts {long}", oracle, plain, gap=True,
        test=significance.paired, evidence=lambda:
        (f"recovers {of_runs(format_percent(share), len(share), len(plain))} "
         f"of the drop; oracle {format_mean_std_of(oracle, num_runs)} vs "
         f"{format_mean_std_of(plain, num_runs)}, paired"))
  for row, base_row in tables.LENGTH_BASES:
    a, b = bleu(row, long), bleu(base_row, long)
    cost = _cost(bleu(row, test_split), bleu(base_row, test_split), test_split)
    check(f"(iii) {row} lifts {long} over {base_row}", a, b, gap=True,
          evidence=lambda: f"{long} {shown(row, a)} vs {shown(base_row, b)}",
          after=f"; change on {cost}")
  return out


def _cost(a: Sequence[float], b: Sequence[float], split: str) -> str:
  """An intervention's change on `split` against its base: the difference of means, with its
  95% interval and p where both have significance.MIN_SEEDS values."""
  if not (a and b):
    return f"{split}: not run"
  if min(len(a), len(b)) < significance.MIN_SEEDS:
    return f"{split} {significance.mean_std(a)[0] - significance.mean_std(b)[0]:+.1f}"
  return f"{split} {significance.describe(significance.welch(a, b))}"
