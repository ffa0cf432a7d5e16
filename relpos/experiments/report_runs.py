"""table.md's sections run by run, after its tables of means (`relpos.experiments.report`):
each run's scores on one line (the checkpoint step scored, every split, the test split's other
scores and checkpoint choices, when it finished, the commits it ran under, the runs restored
from a published table), each run against its seed's baseline by paired bootstrap, where each
run's time went, and each run's validation curve. Runs are read as results.json holds them
(`relpos.experiments.report`'s docstring).
"""

import re

from relpos.experiments import lost_runs
from relpos.experiments import markdown
from relpos.experiments import tables
from relpos.experiments import timing
from relpos.experiments import significance
from relpos.experiments import verdicts

EVERY_RUN = "every run"  # `recipe_lines`' settings of all runs, named first
TIME_PARTS = ("training", "validation", "evaluation")  # the parts of a run's time_s (schema 3)
# The lower-cased BLEU scores beside each cased one (`relpos.scoring`), and their labels.
LOWER_CASED_SCORES = (("bleu_lowercase", "lower-cased"), ("bleu_tokenized_lowercase",
                                                          "lower-cased, tokenized"))


def other_checkpoints(runs: list[dict]) -> list[str]:
  """The checkpoint choices scored beside the main one (`decode.other_checkpoints`) in any of
  `runs`, in order of first appearance."""
  return list(dict.fromkeys(choice for run in runs for choice in run.get("other_checkpoints", {})))


def recipe_lines(runs: list[dict]) -> list[str]:
  """table.md's line on how the runs were made otherwise than their rows' recipes
  (`tables.recipe_differences`: the overrides of the table's command, and defaults changed
  since older runs), grouped by the runs they hold for; none where every run is its recipe."""
  holders: dict[str, list[dict]] = {}
  for run in runs:
    for field, recipe, value in tables.recipe_differences(run):
      setting = (f"`{field}={value!r}` (recipe {recipe!r})" if _has_field(run["config"], field) else
                 f"no `{field}` (recipe {recipe!r}; the config predates it)")
      holders.setdefault(setting, []).append(run)
  by_runs: dict[str, list[str]] = {}
  for setting, held in holders.items():
    by_runs.setdefault(_which_runs(held, len(runs)), []).append(setting)
  if not by_runs:
    return []
  return [
      "Made otherwise than each row's recipe (the task's config with the row's fields), " +
      "; ".join(f"in {which}: {', '.join(settings)}"
                for which, settings in sorted(by_runs.items(), key=lambda i: i[0] != EVERY_RUN)) +
      ".", ""
  ]


def _which_runs(held: list[dict], num_runs: int) -> str:
  """"every run", or "shape seed 0, randomized seeds 0, 1"."""
  if len(held) == num_runs:
    return EVERY_RUN
  by_row: dict[str, list[str]] = {}
  for run in held:
    by_row.setdefault(run["row"], []).append(str(run["seed"]))
  return ", ".join(
      f"{row} seed{'s' * (len(seeds) > 1)} {', '.join(seeds)}" for row, seeds in by_row.items())


def _bootstrap_cell(comparison: dict) -> str:
  """"+1.2 (p = 0.031)": a run against its seed's baseline by paired bootstrap; "p ≤ 0.001"
  at the least p its resamples can give, 1 / (1 + resamples) (the signature's `bs:N`)."""
  resamples = re.search(r"(?:^|\|)bs:(\d+)", comparison["signature"])
  at_floor = resamples and comparison["p_value"] <= 1 / (1 + int(resamples[1])) * (1 + 1e-9)
  p = significance.format_p(comparison["p_value"])
  return f"{comparison['difference']:+.1f} (p {'≤' if at_floor else '='} {p})"


def _has_field(config: dict, field: str) -> bool:
  """Whether the saved `config` holds the dotted `field` (configs saved before a field existed
  lack it)."""
  section = config
  for name in field.split("."):
    if not isinstance(section, dict) or name not in section:
      return False
    section = section[name]
  return True


def _finished_at(run: dict) -> str:
  """"2026-11-24 08:23" (UTC) from the run's environment, "–" for runs that predate it."""
  stamp = run.get("environment", {}).get("finished_at")
  return stamp[:16].replace("T", " ") if stamp else "–"


def _commits_from_step(run: dict) -> str:
  """"2a134ca (0) d911f97 (800)": each commit the run ran under and the step it first started
  at (schema 4); the run's one commit for runs that predate it. A first step above 0 means the
  run's earlier starts were not recorded."""
  first_step = {}
  for start in run.get("starts", []):
    first_step.setdefault(start["commit"], start["step"])
  if not first_step:
    return run["commit"]
  return " ".join(f"{commit} ({step:,})" for commit, step in first_step.items())


def _runs_in_order(runs: list[dict], table: str) -> list[dict]:
  """The runs of `table`, rows in the table's order, then seeds."""
  order = {row: i for i, row in enumerate(verdicts.rows_in_order(runs, table))}
  return sorted((r for r in runs if r["table"] == table), key=lambda r:
                (order[r["row"]], r["seed"]))


def _each_run_lines(table_runs: list[dict], table: str) -> list[str]:
  """One line per run of `table` (`_runs_in_order`): the checkpoint step scored, its BLEU on
  every split, the test split's other scores and checkpoint choices, when it finished and the
  commits it ran under."""
  splits = verdicts.splits_in_order(table_runs)
  test_split = verdicts.main_test_split(table_runs)
  columns = [("step scored", lambda r: r["scores"].get(test_split, {}).get("step"))]
  columns += [(f"{split} BLEU", lambda r, split=split: r["scores"].get(split, {}).get("bleu"))
              for split in splits]
  beside = [(name, f"BLEU ({label})") for name, label in LOWER_CASED_SCORES] + [("chrf", "chrF")]
  columns += [(f"{test_split} {label}",
               lambda r, name=name: r["scores"].get(test_split, {}).get(name))
              for name, label in beside]
  for choice in other_checkpoints(table_runs):
    score = lambda r, choice=choice, name="bleu": (r.get("other_checkpoints", {}).get(choice, {}).
                                                   get(test_split, {}).get(name))
    columns += [(f"{test_split} BLEU ({choice})", score)]
    columns += [(f"{test_split} BLEU ({choice}, {label})",
                 lambda r, score=score, name=name: score(r, name=name))
                for name, label in LOWER_CASED_SCORES]
  # A column only where some run has it (older runs lack lower-cased BLEU, chrF, steps).
  columns = [(name, cell) for name, cell in columns if any(cell(r) is not None for r in table_runs)]

  def text(value) -> str:
    if value is None:
      return "–"
    return f"{value:,}" if isinstance(value, int) else f"{value:.1f}"

  header = ["row", "seed"] + [name for name, _ in columns
                             ] + ["finished (UTC)", "commits (from step)"]
  cell_rows = [[run["row"], str(run["seed"])] + [text(cell(run)) for _, cell in columns] +
               [_finished_at(run), _commits_from_step(run)] for run in table_runs]
  return [f"## {table}: each run", "", *markdown.table(header, cell_rows), ""
         ] + _restored_lines(table_runs) + _lost_lines(table_runs)


def _paired_lines(table_runs: list[dict], table: str) -> list[str]:
  """Per test split, each run's BLEU difference from its seed's baseline run and the p of the
  paired bootstrap (`relpos.experiments.paired`), rows by seeds; none where no run has one."""
  compared = [r for r in table_runs if r.get("paired_bootstrap")]
  if not compared:
    return []
  splits = list(dict.fromkeys(s for r in compared for s in r["paired_bootstrap"]))
  first = compared[0]["paired_bootstrap"][splits[0]]
  baseline, signature = first["against_row"], first["signature"]
  seeds = sorted({r["seed"] for r in table_runs})
  rows = [row for row in verdicts.rows_in_order(table_runs, table) if row != baseline]
  lines = [
      f"## {table}: paired bootstrap against {baseline}, seed by seed", "",
      f"BLEU of each run minus that of the `{baseline}` run of its seed, and the two-sided p of "
      f"sacreBLEU's paired bootstrap over the test sentences (`{signature}`): how often the "
      "choice of test sentences alone moves two equally good systems this far apart. – where "
      "a run of the pair has no translations (restored without them) or has not finished.", ""
  ]
  for split in splits:
    cells = []
    for row in rows:
      by_seed = {
          r["seed"]: r["paired_bootstrap"][split]
          for r in table_runs
          if r["row"] == row and split in r.get("paired_bootstrap", {})
      }
      cells.append([row] +
                   [_bootstrap_cell(by_seed[seed]) if seed in by_seed else "–" for seed in seeds])
    lines += [f"{split}:", "", *markdown.table(["row"] + [f"seed {s}" for s in seeds], cells), ""]
  return lines


def _restored_lines(table_runs: list[dict]) -> list[str]:
  """A sentence naming the runs whose results were written back from a published results.json
  (`--restore_from`) after their folders were lost, if any, with the day of each loss."""
  by_source = {}
  for run in (r for r in table_runs if "restored" in r):
    restored = run["restored"]
    days = [r["at"][:10] for r in restored.get("earlier", [])] + [restored["at"][:10]]
    key = (restored["from"], " and ".join(dict.fromkeys(days)))
    by_source.setdefault(key, []).append(f"{run['row']} seed {run['seed']}")
  return [
      f"Restored from `{source}` on {days} (`--restore_from`: their output folder was lost "
      f"with their checkpoints; these are the results published before): "
      f"{', '.join(names)}.\n" for (source, days), names in by_source.items()
  ]


def _lost_lines(table_runs: list[dict]) -> list[str]:
  """A sentence naming the runs trained again from step 0 after their output folder was lost
  while they trained (`lost_runs`), with how far each had got, if any."""
  lost = [
      f"{run['row']} seed {run['seed']} ({'; '.join(map(lost_runs.describe, run['lost']))})"
      for run in table_runs
      if run.get("lost")
  ]
  return [
      f"Trained again from step 0 after their output folder was lost while they trained "
      f"(`--restore_from` found them in flight in the published in_flight.json; the time "
      f"columns count the new starts only), each having reached: {', '.join(lost)}.\n"
  ] if lost else []


def _time_by_run_lines(table_runs: list[dict], table: str) -> list[str]:
  """Each run's wall time and where it went (schema 3, summed over its starts; "–" for runs
  that predate it), with each part's share, its steps per second and the machine's load
  while they were timed (`timing.describe_load`)."""
  cell_rows = []
  for run in table_runs:
    total, time_s = run["wall_time_s"], run.get("time_s", {})
    parts = [
        f"{time_s[part]:,.0f} s ({time_s[part] / total:.1%})" if part in time_s else "–"
        for part in TIME_PARTS
    ]
    speed = run.get("steps_per_second")
    parts += [f"{speed:.2f}" if speed else "–", timing.describe_load(run)]
    cell_rows.append(
        [run["row"],
         str(run["seed"]), f"{total:,.0f} s ({markdown.duration(total)})", *parts])
  header = [
      "row", "seed", "wall time", "training", "validation", "final evaluation", "steps/s",
      "machine load"
  ]
  return [
      f"## {table}: where each run's time went", "", *markdown.table(header, cell_rows), "",
      timing.LOAD_COLUMN_NOTE, ""
  ]


def _curve_lines(table_runs: list[dict], table: str) -> list[str]:
  """Validation BLEU at every validated step, one line per run (schema 2); none without
  curves."""
  curved = [r for r in table_runs if r.get("validation_curve")]
  if not curved:
    return []
  steps = sorted({step for r in curved for step, _ in r["validation_curve"]})
  cell_rows = []
  for run in curved:
    bleu = dict(run["validation_curve"])
    cell_rows.append([run["row"], str(run["seed"])] +
                     [f"{bleu[step]:.1f}" if step in bleu else "–" for step in steps])
  header = ["row", "seed"] + [f"{step:,}" for step in steps]
  return [f"## {table}: validation BLEU by step", "", *markdown.table(header, cell_rows), ""]


def sections(runs: list[dict], tables: tuple[str, ...]) -> list[str]:
  """The per-run sections of each of `tables` (in that order) that `runs` holds runs of: each
  run, the paired bootstrap, where each run's time went, the validation curves."""
  lines = []
  for table in tables:
    if table_runs := _runs_in_order(runs, table):
      lines += (_each_run_lines(table_runs, table) + _paired_lines(table_runs, table) +
                _time_by_run_lines(table_runs, table) + _curve_lines(table_runs, table))
  return lines
