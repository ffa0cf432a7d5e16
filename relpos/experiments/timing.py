"""Whether a run's steps per second measure its variant alone, from its result record.

A table's steps/s compare variants only when each run had its machine to itself: a run timed
beside other work (a second table, tests, a build) measures the load as much as the variant.
Each run records its machine's load while its steps were timed (`machine_load`, made by
`relpos.metrics_writer.machine_load`), and its starts and end, from which runs of a table that
trained at the same time (`--parallel`, `--stack_seeds`) are found.
"""
import collections
import datetime
import math

from relpos import metrics_writer

# A run counts as timed alone unless more than this share of its timed train records saw a
# loaded machine, or had no load recorded.
LOADED_SHARE_LIMIT = 0.1


def _interval(run: dict) -> tuple[datetime.datetime, datetime.datetime] | None:
  """When a run trained: from its first start to its end (None when either is unrecorded)."""
  started = (run.get("starts") or [{}])[0].get("started_at")
  finished = run.get("environment", {}).get("finished_at")
  if not started or not finished:
    return None
  return datetime.datetime.fromisoformat(started), datetime.datetime.fromisoformat(finished)


def _overlaps(run: dict, other: dict) -> bool:
  """Whether two runs trained at the same time."""
  a, b = _interval(run), _interval(other)
  return a is not None and b is not None and a[0] < b[1] and b[0] < a[1]


def caveat(run: dict, runs: list[dict]) -> str | None:
  """Why `run`'s steps per second do not measure its variant alone, or None when they do:
  "load not recorded" (runs made before relpos recorded it, or more than LOADED_SHARE_LIMIT
  of the timed steps without it), "machine loaded" (more than LOADED_SHARE_LIMIT of its timed
  steps on a machine with more runnable threads than cores + 1), "trained beside other runs"
  (another run of `runs` trained at the same time), "timed on several machines" (its starts
  record more than one device or host CPU: a run stopped on one machine and resumed on
  another) or "timed on another machine than most runs" (runs of `runs` record more than one,
  a table restored from one machine and continued on another, and this run's is not the one
  most of them record)."""
  load = run.get("machine_load") or {}
  unrecorded, loaded = load.get("unrecorded_share"), load.get("loaded_share")
  if unrecorded is None or unrecorded > LOADED_SHARE_LIMIT:
    return "load not recorded"
  if loaded > LOADED_SHARE_LIMIT:
    return "machine loaded"
  if any(other is not run and _overlaps(run, other) for other in runs):
    return "trained beside other runs"
  machines = _machines(run)
  if len(machines) > 1:
    return "timed on several machines"
  if machines and machines != {_most_common_machine(runs)}:
    return "timed on another machine than most runs"
  return None


def _most_common_machine(runs: list[dict]) -> tuple[str, str] | None:
  """The machine most runs trained on alone (`_machines`); None where no run records one, or
  where two machines are recorded equally often (no run's timing is then the table's)."""
  counts = collections.Counter(
      next(iter(m)) for m in map(_machines, runs) if len(m) == 1).most_common(2)
  if not counts or (len(counts) == 2 and counts[0][1] == counts[1][1]):
    return None
  return counts[0][0]


def _machines(run: dict) -> set[tuple[str | None, str]]:
  """The (device kind, host CPU) pairs of the starts that trained steps (a start at the run's
  last trained step, to evaluate or after an early stop, trained none). Starts record their
  machine from 28 November 2026; an earlier start takes that of a later one on the same host,
  else (None, host): unknown, but another machine than the others'. A run whose starts record
  none: its `environment`'s, the machine of its final evaluation; empty where unrecorded."""
  starts = run.get("starts", [])
  if not any(s.get("host_cpu") for s in starts):
    environment = run.get("environment", {})
    if not environment.get("host_cpu"):
      return set()
    return {(environment.get("device_kind"), environment["host_cpu"])}
  curve = run.get("validation_curve") or []
  last = max((step for step, _ in curve),
             default=run.get("config", {}).get("train", {}).get("num_steps", math.inf))
  ends = [s["step"] for s in starts[1:]] + [last]  # each start trains up to the next one
  recorded = [s for s in starts if s.get("host_cpu")]
  known = {s.get("host"): (s.get("device_kind"), s["host_cpu"]) for s in recorded}

  def machine(start: dict) -> tuple[str | None, str]:
    if start.get("host_cpu"):
      return start.get("device_kind"), start["host_cpu"]
    return known.get(start.get("host"), (None, str(start.get("host"))))

  return {machine(s) for s, end in zip(starts, ends) if s["step"] < end}


# Under table.md's time table: what `describe_load`'s cells mean.
LOAD_COLUMN_NOTE = (
    "Machine load: the median load average over the run's timed steps / the cores it could use; "
    f"\"loaded N%\": the share of those steps at a load above the cores + "
    f"{metrics_writer.LOAD_ABOVE_CPUS:g}, shown above {LOADED_SHARE_LIMIT:.0%}; \"recorded for "
    "N%\": the share whose load was recorded, shown when under "
    f"{1 - LOADED_SHARE_LIMIT:.0%}; \"–\": not recorded (runs from before 26 November 2026).")


def describe_load(run: dict) -> str:
  """The machine's load while `run` was timed, as table.md shows it: "1.5 / 2 cores" (median
  load average / the cores), with ", loaded 31%" when the machine was loaded for more than
  LOADED_SHARE_LIMIT of the timed steps and ", recorded for 5%" when the load was recorded
  for less than the rest of them; "–" when unrecorded."""
  load = run.get("machine_load") or {}
  if load.get("median_load_average") is None or load.get("cpus") is None:
    return "–"
  text = f"{load['median_load_average']:.1f} / {load['cpus']} cores"
  if load["loaded_share"] > LOADED_SHARE_LIMIT:
    text += f", loaded {load['loaded_share']:.0%}"
  if load["unrecorded_share"] > LOADED_SHARE_LIMIT:
    text += f", recorded for {1 - load['unrecorded_share']:.0%}"
  return text


def untimed_runs(runs: list[dict], table: str, rows: tuple[str, ...]) -> str:
  """The runs of `rows` of `table` whose steps per second do not measure their variant alone,
  grouped by cause: "load not recorded (abs seeds 0, 1; rel_kv seed 0)"; "" when every run
  was timed alone."""
  by_cause = {}
  for run in runs:
    if run["table"] == table and run["row"] in rows and (why := caveat(run, runs)):
      by_cause.setdefault(why, {}).setdefault(run["row"], []).append(str(run["seed"]))
  return "; ".join(f"{why} (" +
                   "; ".join(f"{row} seed{'s' if len(seeds) > 1 else ''} {', '.join(seeds)}"
                             for row, seeds in by_row.items()) + ")"
                   for why, by_row in by_cause.items())
