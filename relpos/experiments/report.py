"""`table.md` from `results.json` alone: mean ± std over seeds, the paper beside it, and the
findings judged by `relpos.experiments.verdicts`, laid out as markdown; at its end the sections
run by run of `relpos.experiments.report_runs` (scores, finish, commits, paired bootstrap, where
its time went, its validation curve).

`results.json` (schema version RESULTS_SCHEMA_VERSION, written by `relpos.experiments.runner`)
holds

    {"schema_version": 3, "written_at": "2025-01-31T12:00:00+00:00" (UTC),
     "jax_version": "...", "flax_version": "...", "device_kind": "cpu", "device_count": 1,
     "host_cpu": "AMD EPYC (avx2, fma, avx512f, avx512_bf16)" (from 24 November 2026),
     "runs": [run, ...],
     "failed": [{"run", "error", "failed_at", "checkpoint", "log"}, ...] (from 28 November
     2026: the runs that failed and have not finished since, `relpos.experiments.failed_runs`)}

with one run per (table, row, seed), each also holding the "environment" (versions, device,
"finished_at") it was made in:

    {"table": "ablation" | "k_sweep", "row": "rel_kv" | "k=4", "seed": 0,
     "k": 4 | None, "task": "synthetic", "commit": "...", "wall_time_s": ...,
     "time_s": {"training": ..., "validation": ..., "evaluation": ...} (schema 3: where
     wall_time_s went, see `relpos.experiments.single_run.run_one`),
     "steps_per_second": ..., "num_params": ...,
     "machine_load": {"median_load_average", "cpus", "loaded_share", "unrecorded_share"}
     (from 26 November 2026: the machine's load while the steps were timed,
     `relpos.metrics_writer.machine_load`),
     "validation_curve": [[step, validation BLEU], ...] (schema 2),
     "starts": [{"started_at", "step", "commit", "host", "cpus", "variant_code",
     "tokenizer_sha256", "host_cpu", "device_kind", "config_changes"}, ...], "commits": [...]
     (schema 4: every start of the run and the commits it ran under, oldest first; "cpus"
     and, for a position variant of the user's own, "variant_code" from 26 November 2026;
     "host_cpu", "device_kind" and, where fields changed since the last start,
     "config_changes" [{"field", "before", "after"}] from 28 November 2026),
     "scores": {split: {"bleu": ..., "chrf": ..., "signature": ..., ...,
       "bleu_by_subset": {name: {"num_sentences", "bleu"}}}} (from 26 November 2026, on the
       synthetic task's test splits: `relpos.experiments.diagnostics.bleu_by_subset`),
     "other_checkpoints": {"average:10": {split: {...}}, ...} (schema 4: the scores of
     `decode.other_checkpoints` beside `decode.checkpoint`'s),
     "bleu_by_source_length": {split: {"13-16": ..., "24": ..., ...}},
     "position_statistics": {...} (`relpos.attention_statistics`), "config": {...},
     schema 5, the length diagnostics (`relpos.experiments.diagnostics`), per test split:
     "length_statistics": {split: {"unit", "ratio", "shorter", "longer", "num_sentences",
       "by_source_length": {bucket: {"ratio", "shorter", "longer", "num_sentences"}}}},
     "oracle_length": {split: {"bleu", "chrf", ..., "bleu_by_source_length": {...}}},
     "token_accuracy_by_position": {split: {"accuracy": [...], "count": [...],
       "eos_accuracy", "early_eos" (from 28 November 2026), "accuracy_all"}},
     "attention_profile": {split: {"entropy_by_query": [layer][position],
       "normalized_entropy": [layer], "attention_by_offset", "offsets", "count_by_query",
       "mean_length"}}}

The `length` table (docs/length.md) shows test and test_long BLEU beside test_long BLEU at the
references' lengths (oracle length) and the test_long length ratio, with its own findings
(`relpos.experiments.verdicts.length_findings`); its sections, and BLEU by what a split holds,
are laid out by `relpos.experiments.report_length`.
"""

import json
from collections.abc import Sequence

from relpos import json_files
from relpos.experiments import failed_runs
from relpos.experiments import markdown
from relpos.experiments import paper
from relpos.experiments import report_length
from relpos.experiments import report_runs
from relpos.experiments import timing
from relpos.experiments import significance
from relpos.experiments import verdicts

# Beside a row's steps/s when some of its runs were not timed alone (`timing.caveat`).
UNTIMED_MARK = "†"

# 1: {"runs"} only; 2: + schema_version, written_at, versions and device (file and runs), each
# run's validation_curve; 3: + each run's time_s; 4: + each run's starts, commits and
# other_checkpoints, and time_s summed over every start of a run; 5: + each run's length
# diagnostics (length_statistics, oracle_length, token_accuracy_by_position, attention_profile)
# and the length table.
RESULTS_SCHEMA_VERSION = 5

TABLES = ("ablation", "k_sweep", "length")  # the order of their sections in table.md


def load_results(results_path: str) -> dict:
  """Reads a `results.json` file of this or an earlier schema version.

  Raises:
    ValueError: the file has a newer schema version than this code reads.
  """
  with open(results_path, encoding="utf-8") as f:
    results = json.load(f)
  version = results.get("schema_version", 1)
  if version > RESULTS_SCHEMA_VERSION:
    raise ValueError(f"{results_path}: schema_version={version} is newer than this relpos "
                     f"reads ({RESULTS_SCHEMA_VERSION}); update relpos.")
  return results


def load_runs(results_path: str) -> list[dict]:
  """The runs of a `results.json` file (`load_results`)."""
  return load_results(results_path)["runs"]


def _other_checkpoint_cell(row_runs: list[dict], choice: str, split: str) -> str:
  """Mean ± std of `split` BLEU at checkpoint `choice` (e.g. average:10) over the runs that
  scored it, saying how many of the row's runs those are when not all (a run reused from before
  `decode.other_checkpoints` asked for it)."""
  values = [
      r["other_checkpoints"][choice][split]["bleu"]
      for r in row_runs
      if choice in r.get("other_checkpoints", {})
  ]
  return verdicts.format_mean_std_of(values, len(row_runs))


def _table_section(runs: list[dict], table: str) -> list[str]:
  rows = verdicts.rows_in_order(runs, table)
  if not rows:
    return []
  table_runs = [r for r in runs if r["table"] == table]
  if table == "length":
    return ([
        "## length", "", *report_length.length_table_lines(table_runs, rows),
        *_time_lines(table_runs), *report_length.subset_lines(table_runs, rows),
        *report_length.diagnostics_lines(runs, table, rows)
    ])
  splits = verdicts.splits_in_order(table_runs)
  test_split = verdicts.main_test_split(table_runs)
  # Lower-cased BLEU and chrF only where every run has them (older runs lack the first).
  beside = [(name, label)
            for name, label in (("bleu_lowercase", "BLEU (lower-cased)"), ("chrf", "chrF"))
            if all(name in r["scores"].get(test_split, {}) for r in table_runs)]
  others = report_runs.other_checkpoints(table_runs)
  header = (["row", "seeds"] + [f"{s} BLEU" for s in splits] +
            [f"{test_split} {label}" for _, label in beside] +
            [f"{test_split} BLEU ({choice})" for choice in others] + ["paper", "params", "steps/s"])
  cell_rows = []
  for row in rows:
    if table == "k_sweep":
      k = int(row.split("=")[1])
      figure = paper.K_SWEEP_FIGURES.get(k)
      paper_cell = f"{figure}" if figure is not None else "–"
    else:
      figure = paper.ABLATION_FIGURES.get(row)
      paper_cell = f"{figure[0]} ({figure[1]})" if figure else "–"
    seeds = len(verdicts.field_values(runs, table, row, "seed"))
    params = verdicts.field_values(runs, table, row, "num_params")
    speed = verdicts.field_values(runs, table, row, "steps_per_second")
    cells = [row, str(seeds)] + [
        verdicts.format_mean_std_of(verdicts.bleu_values(runs, table, row, s), seeds)
        for s in splits
    ]
    row_runs = [r for r in table_runs if r["row"] == row]
    cells += [
        verdicts.format_mean_std([r["scores"][test_split][name]
                                  for r in row_runs])
        for name, _ in beside
    ]
    cells += [_other_checkpoint_cell(row_runs, choice, test_split) for choice in others]
    untimed_mark = UNTIMED_MARK if any(timing.caveat(r, runs) for r in row_runs) else ""
    cells += [
        paper_cell, f"{params[0]:,}" if params else "–",
        f"{significance.mean_std(speed)[0]:.2f}{untimed_mark}" if speed else "–"
    ]
    cell_rows.append(cells)
  lines = [f"## {table}", "", *markdown.table(header, cell_rows), ""]
  if untimed := timing.untimed_runs(runs, table, tuple(rows)):
    lines += [
        f"{UNTIMED_MARK} steps/s averages runs not timed alone, so it does not measure the "
        f"variant: {untimed}.", ""
    ]
  lines += _time_lines(table_runs)
  with_oracle = all("oracle_length" in r for r in table_runs)  # its BLEU by length below
  for split in [s for s in splits if s != "validation" and not with_oracle]:
    lines += report_length.bucket_table(
        table_runs, rows, table, split, f"BLEU by source length (words), {split}:",
        lambda row_runs, bucket, split=split: verdicts.format_mean_std(
            report_length.values_at_length(row_runs, split, bucket, report_length.bleu_at_length)))
  return [
      *lines, *report_length.subset_lines(table_runs, rows),
      *report_length.diagnostics_lines(runs, table, rows)
  ]


def _time_lines(runs: list[dict]) -> list[str]:
  """Where a run's wall time went, averaged over the runs that record it (schema 3); no line
  when none does."""
  timed = [r for r in runs if "time_s" in r]
  if not timed:
    return []
  mean = lambda values: sum(values) / len(timed)
  parts = {part: mean([r["time_s"][part] for r in timed]) for part in report_runs.TIME_PARTS}
  total = mean([r["wall_time_s"] for r in timed])
  hours = f" ({markdown.duration(total)})" if total >= 3600 else ""
  return [
      f"Time per run (mean of {len(timed)}): {total:,.0f} s{hours} = training "
      f"{parts['training']:,.0f} s (steps, compilation, checkpoints) + validation during "
      f"training {parts['validation']:,.0f} s + final evaluation {parts['evaluation']:,.0f} s "
      "(every split, position statistics, length diagnostics).", ""
  ]


def _signatures(runs: list[dict], key: str) -> list[str]:
  """The distinct values of `key` (a score's signature) over every split of `runs`, sorted."""
  return sorted({scores[key] for r in runs for scores in r["scores"].values() if key in scores})


def render_table(runs: list[dict], failed: Sequence[dict] = ()) -> str:
  """The markdown of `table.md` for the finished `runs` and the `failed` ones (results.json's
  "failed": `relpos.experiments.failed_runs`)."""
  failed_lines = [failed_runs.note(list(failed)), ""] if failed else []
  if not runs:
    return "\n".join([
        "# relpos results", "", "No run has finished yet; `--status` with the table's command "
        "says where each stands.", "", *failed_lines
    ])
  tasks = sorted({r["task"] for r in runs})
  commits = list(dict.fromkeys(c for r in runs for c in r.get("commits", [r["commit"]])))
  lines = [
      f"# relpos results: {', '.join(tasks)}", "",
      f"Made from results.json ({len(runs)} runs; commits {', '.join(commits)}). "
      "BLEU is cased sacreBLEU (mean ± sample std over seeds); the paper's figures are "
      "WMT14 EN-DE, for the direction of each effect, not its size.", "", *failed_lines
  ]
  if signatures := _signatures(runs, "signature"):
    lines += [f"sacreBLEU signature: `{', '.join(signatures)}`.", ""]
  if tokenized := _signatures(runs, "tokenized_lowercase_signature"):
    lines += [
        "\"Lower-cased, tokenized\": BLEU of text lower-cased, punctuation-normalized and "
        "tokenized by Moses's rules, as multi-bleu.perl and fairseq score it in much of the "
        f"literature (`relpos.scoring`; `{', '.join(tokenized)}`).", ""
    ]
  scored = sorted({r["config"].get("decode", {}).get("checkpoint", "best") for r in runs})
  others = report_runs.other_checkpoints(runs)
  lines += [
      f"Checkpoint scored: {', '.join(scored)} ('best' by validation BLEU)" +
      (f"; beside it {', '.join(others)} ('average:N': the parameters of the last N "
       "checkpoints averaged)" if others else "") + ".", ""
  ] + report_runs.recipe_lines(runs)
  for table in TABLES:
    lines += _table_section(runs, table)
  if any(r["table"] == "length" for r in runs):
    lines += report_length.length_findings_lines(runs)
  each_run = report_runs.sections(runs, TABLES)
  if all(r["table"] == "length" for r in runs):
    return "\n".join(lines + each_run) + "\n"
  margin = verdicts.MARGIN_BLEU
  lines += [
      "## The paper's findings, here", "", f"Each finding compares the per-seed values of rows "
      f"({verdicts.main_test_split(runs)} BLEU unless it says otherwise) by Welch's t-test: "
      f"difference of means [95% confidence interval], two-sided p. {significance.RULE} A "
      f"predicted gap (2, 2b: each k >= 1 over k=0, 6) must reach {margin} BLEU; a predicted "
      f"match (1, 3: each pair of k >= 2, 4a) may miss by {margin} BLEU; 4b predicts rel_v "
      f"above the midpoint of rel_kv and none (more than half of rel_kv's gain: the contrast "
      f"rel_v - (rel_kv + none) / 2 above 0, its error from all three rows, Welch-Satterthwaite "
      f"degrees of freedom) and rel_kv above none; 5 predicts a drop "
      f"within 5 points of the paper's. Rows with fewer than {significance.MIN_SEEDS} seeds get "
      f"no verdict; 5 is judged only on runs timed alone (no other run of the table beside "
      f"them, the machine's load average at most its cores + 1 for "
      f"{1 - timing.LOADED_SHARE_LIMIT:.0%} of their timed steps).", "",
      *markdown.table(["finding", "reproduced", "evidence"],
                      [list(finding) for finding in verdicts.findings(runs)])
  ]
  return "\n".join(lines + [""] + each_run) + "\n"


def write_table(results_path: str, table_path: str) -> str:
  """Rebuilds `table.md` from `results.json` alone; returns the markdown."""
  results = load_results(results_path)
  text = render_table(results["runs"], results.get("failed", []))
  json_files.write_text(table_path, text)  # whole or not at all
  return text
