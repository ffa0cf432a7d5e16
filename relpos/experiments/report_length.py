"""The sections of `table.md` on why longer sentences fail (docs/length.md): the length table
(test, the long split, the long split at oracle length, the length ratio, the share of the drop
oracle length recovers) and its findings, BLEU by what a split holds (the synthetic task's
subsets), and the length diagnostics of `relpos.experiments.diagnostics` by source length and
target position. `relpos.experiments.report` lays them out in table.md."""

from relpos.experiments import markdown
from relpos.experiments import significance
from relpos.experiments import verdicts


def bucket_label(bucket: str) -> str:
  """A length bucket's label: "12" for a bucket of one length (stored "12" or "12-12")."""
  low, _, high = bucket.partition("-")
  return low if high in ("", low) else bucket


def length_buckets(runs: list[dict], split: str) -> list[str]:
  """The source-length buckets ("4-11") any of `runs` scores `split` by, shortest first."""
  buckets = {b for run in runs for b in run.get("bleu_by_source_length", {}).get(split, {})}
  return sorted(buckets, key=lambda b: int(b.split("-")[0]))


def bleu_at_length(run: dict, split: str, bucket: str) -> float | None:
  """A run's BLEU on the sources of `split` in length `bucket` (None: not scored)."""
  return run.get("bleu_by_source_length", {}).get(split, {}).get(bucket)


def length_statistics_at_length(run: dict, split: str, bucket: str) -> dict | None:
  """A run's length statistics on the sources of `split` in length `bucket` ({"ratio",
  "shorter", "longer", "num_sentences"}; None: not measured)."""
  return run.get("length_statistics", {}).get(split, {}).get("by_source_length", {}).get(bucket)


def sentences_at_length(runs: list[dict], split: str, bucket: str) -> int | None:
  """How many sentences of `split` length `bucket` holds, from the first of `runs` whose length
  statistics count them (the same in every run of a task; None: none counts them)."""
  for run in runs:
    if stats := length_statistics_at_length(run, split, bucket):
      return stats["num_sentences"]
  return None


def oracle_bleu_at_length(run: dict, split: str, bucket: str) -> float | None:
  """`bleu_at_length` of the run's oracle-length decoding (None: not decoded so)."""
  oracle = run.get("oracle_length", {}).get(split, {})
  return oracle.get("bleu_by_source_length", {}).get(bucket)


def values_at_length(runs: list[dict], split: str, bucket: str, value) -> list[float]:
  """value(run, split, bucket) of each of `runs` that has it (`bleu_at_length`, ...)."""
  return [v for v in (value(r, split, bucket) for r in runs) if v is not None]


def subset_lines(runs: list[dict], rows: list[str]) -> list[str]:
  """Of one table's runs: per test split its task divides (`diagnostics.bleu_by_subset`: the
  synthetic task's test_long by construction, test by whether a pair occurs in training), a
  row x subset table of BLEU; nothing for runs scored before subsets were."""
  lines = []
  for split in [s for s in verdicts.splits_in_order(runs) if s != "validation"]:
    have = [r for r in runs if "bleu_by_subset" in r["scores"].get(split, {})]
    if not have:
      continue
    sizes = {}  # subset -> its sentences, in the order of the first run that has it
    for run in have:
      for name, subset in run["scores"][split]["bleu_by_subset"].items():
        sizes.setdefault(name, subset["num_sentences"])
    cell_rows = []
    for row in rows:
      num_runs = sum(r["row"] == row for r in runs)  # with those scored before subsets were
      cell_rows.append([row] + [
          verdicts.format_mean_std_of(
              verdicts.subset_bleu_values(have, have[0]["table"], row, split, name), num_runs)
          for name in sizes
      ])
    lines += [
        f"BLEU by what {split} holds (sentences):", "",
        *markdown.table(["row", *(f"{name} ({size})" for name, size in sizes.items())], cell_rows),
        ""
    ]
  if lines:
    lines += [
        "Subsets (`relpos.data.synthetic.subsets_of`): test_long by construction (no training "
        "sentence joins two clauses or holds two relative clauses: the seen constructions differ "
        "from training by length alone; runs before 28 November 2026 split it by clause count), "
        "the other splits by whether a pair also occurs in training.", ""
    ]
  return lines


def length_table_lines(runs: list[dict], rows: list[str]) -> list[str]:
  """The main table of the length table: test, long split (and its length-alone split where
  scored), long split at oracle length, its length ratio and early / late stops, and the share
  of the drop oracle length recovers."""
  test_split, long = verdicts.main_test_split(runs), verdicts.long_split(runs)
  splits = [test_split] + ([long] if long != test_split else [])
  splits += [s for s in verdicts.splits_in_order(runs) if s == verdicts.LENGTH_ALONE_SPLIT]
  header = (["row", "seeds"] + [f"{s} BLEU" for s in splits] + [
      f"{long} BLEU (oracle length)", f"{long} length ratio", f"{long} shorter", f"{long} longer",
      "drop recovered by oracle length"
  ])
  cell_rows = []
  for row in rows:
    row_runs = verdicts.runs_of_row(runs, "length", row)
    cells = [row, str(len(row_runs))]
    for values in (verdicts.bleu_values(runs, "length", row, s) for s in splits):
      cells.append(verdicts.of_runs(verdicts.format_mean_std(values), len(values), len(row_runs)))
    cells += [
        verdicts.of_runs(format_values(values), len(values), len(row_runs))
        for format_values, values in ((verdicts.format_mean_std,
                                       verdicts.oracle_bleu(row_runs, long)),
                                      (verdicts.format_ratio,
                                       verdicts.length_values(row_runs, long, "ratio")),
                                      (verdicts.format_percent,
                                       verdicts.length_values(row_runs, long, "shorter")),
                                      (verdicts.format_percent,
                                       verdicts.length_values(row_runs, long, "longer")),
                                      (verdicts.format_percent,
                                       verdicts.recovered_shares(row_runs, test_split, long)))
    ]
    cell_rows.append(cells)
  return markdown.table(header, cell_rows) + [
      "", f"Length ratio: hypothesis over reference length, summed over the split, "
      f"in target tokens (the task's SentencePiece pieces, eos excluded); "
      f"shorter / longer: the share of hypotheses that stop before / run past "
      f"their reference's length. Oracle length: beam search with eos "
      f"forbidden before the reference's length in target tokens and forced "
      f"at it (Newman et al. 2020). Drop recovered: (oracle {long} - {long}) / "
      f"({test_split} - {long}) BLEU, per seed (a seed whose drop is under "
      f"{verdicts.MARGIN_BLEU} BLEU has no share, and the cell says of how many runs it is).", ""
  ]


def bucket_table(runs: list[dict], rows: list[str], table: str, split: str, title: str,
                 cell) -> list[str]:
  """A row x source-length bucket table; cell(runs of the row, bucket) -> text; below the rows,
  the sentences each bucket holds where the runs count them (a mean over 2 sentences is
  noise)."""
  buckets = length_buckets(runs, split)
  if not buckets:
    return []
  cell_rows = [
      [row] + [cell(verdicts.runs_of_row(runs, table, row), b) for b in buckets] for row in rows
  ]
  counts = [sentences_at_length(runs, split, b) for b in buckets]
  if any(count is not None for count in counts):
    cell_rows.append(["sentences", *("–" if c is None else str(c) for c in counts)])
  return [title, "", *markdown.table(["row", *map(bucket_label, buckets)], cell_rows), ""]


def diagnostics_lines(runs: list[dict], table: str, rows: list[str]) -> list[str]:
  """The length diagnostics of a table's runs (schema 5), per test split: BLEU and oracle-
  length BLEU by source length, the length ratio and early stops by source length, the
  teacher-forced token accuracy by target position and the encoder's attention entropy."""
  table_runs = [r for r in runs if r["table"] == table and "length_statistics" in r]
  if not table_runs:
    return []
  lines = []
  for split in [s for s in verdicts.splits_in_order(table_runs) if s != "validation"]:

    def bleu_cell(row_runs, bucket, split=split):
      plain = values_at_length(row_runs, split, bucket, bleu_at_length)
      oracle = values_at_length(row_runs, split, bucket, oracle_bleu_at_length)
      return f"{verdicts.format_mean_std(plain)} → {verdicts.format_mean_std(oracle)}"

    def ratio_cell(row_runs, bucket, split=split):
      stats = values_at_length(row_runs, split, bucket, length_statistics_at_length)
      return (f"{verdicts.format_ratio([x['ratio'] for x in stats])} "
              f"({verdicts.format_percent([x['shorter'] for x in stats])} short)") if stats else "–"

    lines += bucket_table(table_runs, rows, table, split,
                          f"BLEU → BLEU at oracle length, by source length (words), {split}:",
                          bleu_cell)
    lines += bucket_table(
        table_runs, rows, table, split,
        f"Length ratio (target tokens) and share of early stops, by source "
        f"length (words), {split}:", ratio_cell)
  lines += _accuracy_lines(table_runs, table, rows)
  lines += _attention_lines(table_runs, table, rows)
  return lines


# Target positions are shown in ranges of this many tokens.
POSITION_RANGE = 8
# A run's token accuracy over fewer targets than this (at a position, or in a range of them)
# is not shown: a cell of 1 token a seed would read 100.0 ± 0.0.
MIN_TOKENS_PER_POSITION = 10
EARLY_EOS_NOTE = ("; eos predicted early: the share of the other target tokens where eos is "
                  "predicted instead, a stop before the target's end")


def _accuracy_lines(runs: list[dict], table: str, rows: list[str]) -> list[str]:
  """Teacher-forced token accuracy (%) by target position range and on eos, per test split."""
  lines = []
  for split in [s for s in verdicts.splits_in_order(runs) if s != "validation"]:
    have = [r for r in runs if split in r.get("token_accuracy_by_position", {})]
    if not have:
      continue
    counts = [sum(c) for c in zip(*(r["token_accuracy_by_position"][split]["count"] for r in have))]
    last = max((i for i, c in enumerate(counts) if c), default=-1)
    ranges = [(low, min(low + POSITION_RANGE, last + 1))
              for low in range(0, last + 1, POSITION_RANGE)
              if any(
                  sum(r["token_accuracy_by_position"][split]["count"][low:low + POSITION_RANGE]) >=
                  MIN_TOKENS_PER_POSITION for r in have)]  # a range no run shows: no column
    early = any("early_eos" in r["token_accuracy_by_position"][split] for r in have)
    header = ["row", *(f"{a}-{b - 1}" if b - 1 > a else f"{a}" for a, b in ranges), "eos"]
    header += ["eos predicted early (%)"] if early else []
    cell_rows = []
    for row in rows:
      row_runs = [r for r in have if r["row"] == row]
      cells = [row]
      for low, high in ranges:
        values = []
        for r in row_runs:
          stats = r["token_accuracy_by_position"][split]
          count = sum(stats["count"][low:high])
          if count >= MIN_TOKENS_PER_POSITION:
            values.append(100 * sum(
                a * c for a, c in zip(stats["accuracy"][low:high], stats["count"][low:high]) if c) /
                          count)
        cells.append(verdicts.format_mean_std_of(values, len(row_runs)))
      eos = [100 * r["token_accuracy_by_position"][split]["eos_accuracy"] for r in row_runs]
      cells.append(verdicts.format_mean_std(eos))
      if early:  # runs scored before 28 November 2026 lack it
        shares = [
            100 * r["token_accuracy_by_position"][split]["early_eos"]
            for r in row_runs
            if "early_eos" in r["token_accuracy_by_position"][split]
        ]
        cells.append(verdicts.format_mean_std_of(shares, len(row_runs)))
      cell_rows.append(cells)
    lines += [
        f"Teacher-forced token accuracy (%) by target position (tokens, from 0), and on "
        f"eos, {split} (a run counts in a range that at least {MIN_TOKENS_PER_POSITION} of its "
        f"targets reach{EARLY_EOS_NOTE if early else ''}):", "", *markdown.table(header, cell_rows),
        ""
    ]
  return lines


def _attention_lines(runs: list[dict], table: str, rows: list[str]) -> list[str]:
  """Normalized entropy of the encoder's self-attention per layer, each test split side by
  side (1 = uniform over the sentence, 0 = one key)."""
  splits = [
      s for s in verdicts.splits_in_order(runs)
      if s != "validation" and any(s in r.get("attention_profile", {}) for r in runs)
  ]
  if not splits:
    return []
  layers = max(
      len(r["attention_profile"][s]["normalized_entropy"])
      for r in runs
      for s in splits
      if s in r.get("attention_profile", {}))
  header = ["row"] + [f"layer {layer} ({' / '.join(splits)})" for layer in range(layers)]
  cell_rows = []
  for row in rows:
    row_runs = [r for r in runs if r["row"] == row]
    cells = [row]
    for layer in range(layers):
      cells.append(" / ".join(
          verdicts.format_ratio([
              r["attention_profile"][s]["normalized_entropy"][layer]
              for r in row_runs
              if s in r.get("attention_profile", {}) and
              layer < len(r["attention_profile"][s]["normalized_entropy"])
          ])
          for s in splits))
    cell_rows.append(cells)
  return [
      f"Encoder self-attention entropy over log(sentence length) (1 = uniform, 0 = one "
      f"key), {' / '.join(splits)} sources:", "", *markdown.table(header, cell_rows), ""
  ]


def length_findings_lines(runs: list[dict]) -> list[str]:
  """The length table's findings section."""
  test_split, long = verdicts.main_test_split(runs), verdicts.long_split(runs)
  alone_split = (f", and on {verdicts.LENGTH_ALONE_SPLIT} (a split of those constructions only, "
                 f"at {long}'s lengths)"
                 if verdicts.LENGTH_ALONE_SPLIT in verdicts.splits_in_order(runs) else "")
  return [
      "## Length findings", "",
      f"Each finding compares per-seed values by Welch's t-test ((ii): the same runs decoded "
      f"two ways, by a paired t-test): difference of means [95% confidence interval], "
      f"two-sided p. {significance.RULE} Each finding predicts a gap of at least "
      f"{verdicts.MARGIN_BLEU} BLEU. (i) is also judged on the {long} sentences built only "
      f"of constructions seen in training ({verdicts.LENGTH_ALONE_SUBSET!r}: length alone) "
      f"where the runs score them{alone_split}. (ii) also gives "
      f"the share of the drop ({test_split} minus {long} BLEU) that oracle length recovers; "
      f"(iii) gives each intervention's change on {test_split} (its cost). Rows with fewer "
      f"than {significance.MIN_SEEDS} seeds get no verdict.", "",
      *markdown.table(["finding", "holds", "evidence"],
                      [list(finding) for finding in verdicts.length_findings(runs)]), ""
  ]
