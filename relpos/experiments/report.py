"""`table.md` from `results.json` alone: mean ± std over seeds, the paper beside it, findings.

`results.json` (schema version RESULTS_SCHEMA_VERSION, written by `relpos.experiments.runner`)
holds

    {"schema_version": 2, "written_at": "2025-01-31T12:00:00+00:00" (UTC),
     "jax_version": "...", "flax_version": "...", "device_kind": "cpu", "device_count": 1,
     "runs": [run, ...]}

with one run per (table, row, seed), each also holding the "environment" (versions, device,
"finished_at") it was made in:

    {"table": "ablation" | "k_sweep", "row": "rel_kv" | "k=4", "seed": 0,
     "k": 4 | None, "task": "synthetic", "commit": "...", "wall_time_s": ...,
     "steps_per_second": ..., "num_params": ...,
     "scores": {split: {"bleu": ..., "chrf": ..., "signature": ..., ...}},
     "bleu_by_source_length": {split: {"13-16": ..., ...}}, "config": {...}}
"""

import json
import math
import os
from collections.abc import Sequence

from relpos.experiments import paper

# A finding "reproduces" when the gap it predicts holds by at least this many BLEU.
MARGIN_BLEU = 1.0


# 1: {"runs"} only; 2: + schema_version, written_at, versions and device (file and runs).
RESULTS_SCHEMA_VERSION = 2


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
  return [r[name] for r in runs if r["table"] == table and r["row"] == row]


def length_buckets(runs: list[dict], split: str) -> list[str]:
  buckets = []
  for run in runs:
    for bucket in run.get("bleu_by_source_length", {}).get(split, {}):
      if bucket not in buckets:
        buckets.append(bucket)
  return sorted(buckets, key=lambda b: int(b.split("-")[0]))


def _mean_of(runs, table, row, split) -> float | None:
  values = _scores(runs, table, row, split)
  return mean_std(values)[0] if values else None


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


def findings(runs: list[dict]) -> list[tuple[str, str, str]]:
  """Checks each of the paper's findings against the runs.

  Returns:
    (finding, verdict, evidence) triples; verdict is "yes", "no" or
    "not run" where the rows it needs are missing.
  """
  test_split = main_test_split(runs)
  m = lambda row, table="ablation", split=test_split: _mean_of(runs, table, row, split)
  out = []

  def check(finding, needed, holds, evidence):
    if any(v is None for v in needed):
      out.append((finding, "not run", "–"))
    else:
      out.append((finding, "yes" if holds() else "no", evidence()))

  rel, ab, none_, rel_k, rel_v = m("rel_kv"), m("abs"), m("none"), m("rel_k"), m("rel_v")
  check(f"1. relative matches or beats absolute ({test_split} BLEU)", [rel, ab],
        lambda: rel >= ab - MARGIN_BLEU,
        lambda: f"rel_kv {rel:.1f} vs abs {ab:.1f}")
  check("2. no position information collapses quality", [rel, none_],
        lambda: none_ <= rel - MARGIN_BLEU,
        lambda: f"none {none_:.1f} vs rel_kv {rel:.1f}")
  k_means = {r: m(r, "k_sweep") for r in rows_in_order(runs, "k_sweep")}
  k0 = k_means.get("k=0")
  check("2b. k = 0 collapses like no position", [k0, rel],
        lambda: k0 <= rel - MARGIN_BLEU,
        lambda: f"k=0 {k0:.1f} vs rel_kv {rel:.1f}")
  flat = [v for r, v in k_means.items() if int(r.split("=")[1]) >= 2]
  check("3. quality is flat for k >= 2", [flat or None],
        lambda: max(flat) - min(flat) <= MARGIN_BLEU,
        lambda: f"range {min(flat):.1f}–{max(flat):.1f} over {len(flat)} values of k")
  check("4a. a^K alone recovers all of it", [rel_k, rel],
        lambda: rel_k >= rel - MARGIN_BLEU,
        lambda: f"rel_k {rel_k:.1f} vs rel_kv {rel:.1f}")
  check("4b. a^V alone recovers most of it", [rel_v, rel, none_],
        lambda: rel_v - none_ >= 0.5 * (rel - none_),
        lambda: f"rel_v {rel_v:.1f}, between none {none_:.1f} and rel_kv {rel:.1f}")
  sps = lambda row: (mean_std(_field(runs, "ablation", row, "steps_per_second"))[0]
                     if _field(runs, "ablation", row, "steps_per_second") else None)
  s_rel, s_abs = sps("rel_kv"), sps("abs")
  check(f"5. rel_kv costs about {paper.SPEED_DROP:.0%} of steps per second", [s_rel, s_abs],
        lambda: 1 - s_rel / s_abs <= paper.SPEED_DROP + 0.05,
        lambda: f"drop {1 - s_rel / s_abs:.1%} ({s_rel:.2f} vs {s_abs:.2f} steps/s)")
  long_rel, long_abs = m("rel_kv", split="test_long"), m("abs", split="test_long")
  check("6. (later work) relative beats absolute on longer sentences", [long_rel, long_abs],
        lambda: long_rel >= long_abs + MARGIN_BLEU,
        lambda: f"test_long rel_kv {long_rel:.1f} vs abs {long_abs:.1f}")
  return out


def _table_section(runs: list[dict], table: str) -> list[str]:
  rows = rows_in_order(runs, table)
  if not rows:
    return []
  table_runs = [r for r in runs if r["table"] == table]
  splits = splits_in_order(table_runs)
  test_split = main_test_split(table_runs)
  # Lower-cased BLEU only where every run has it (runs from before it was recorded lack it).
  lowercase = all("bleu_lowercase" in r["scores"].get(test_split, {}) for r in table_runs)
  header = (["row", "seeds"] + [f"{s} BLEU" for s in splits]
            + ([f"{test_split} BLEU (lower-cased)"] if lowercase else [])
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
    if lowercase:
      cells.append(_format([r["scores"][test_split]["bleu_lowercase"] for r in table_runs
                            if r["row"] == row]))
    cells += [paper_cell, f"{params[0]:,}" if params else "–",
              f"{mean_std(speed)[0]:.2f}" if speed else "–"]
    lines.append("| " + " | ".join(cells) + " |")
  lines.append("")
  for split in [s for s in splits if s != "validation"]:
    buckets = length_buckets(table_runs, split)
    if not buckets:
      continue
    lines += [f"BLEU by source length (words), {split}:", "",
              "| row | " + " | ".join(buckets) + " |", "|" + " --- |" * (len(buckets) + 1)]
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


def render_table(runs: list[dict]) -> str:
  """The markdown of `table.md` for the given runs."""
  tasks = sorted({r["task"] for r in runs})
  commits = sorted({r["commit"] for r in runs})
  lines = [f"# relpos results: {', '.join(tasks)}", "",
           f"Made from results.json ({len(runs)} runs; commits {', '.join(commits)}). "
           "BLEU is cased sacreBLEU (mean ± sample std over seeds); the paper's figures are "
           "WMT14 EN-DE, for the direction of each effect, not its size.", ""]
  signatures = sorted({scores["signature"] for r in runs for scores in r["scores"].values()
                       if "signature" in scores})
  if signatures:
    lines += [f"sacreBLEU signature: `{', '.join(signatures)}`.", ""]
  for table in ("ablation", "k_sweep"):
    lines += _table_section(runs, table)
  lines += ["## The paper's findings, here", "",
            f"A finding reproduces when its predicted gap holds within {MARGIN_BLEU} BLEU "
            f"on mean {main_test_split(runs)} BLEU.", "", "| finding | reproduced | evidence |",
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
