r"""Runs a table of experiments: every row and seed, then results.json, table.md and plots.

  python -m relpos.experiments.run --table=ablation --task=synthetic --seeds=3 \
      --output_dir=runs/ablation_synthetic
  python -m relpos.experiments.run --table=k_sweep --task=synthetic --seeds=3 \
      --output_dir=runs/k_sweep_synthetic
  # why longer sentences fail (docs/length.md): test_long beside oracle-length decoding and
  # the length ratio, for the main variants and the length-extrapolation interventions
  python -m relpos.experiments.run --table=length --task=synthetic --seeds=3 \
      --output_dir=runs/length_synthetic
  # a reduced budget on every run (any config field, as train.py takes it):
  python -m relpos.experiments.run --table=ablation --rows=abs,rel_kv,none --task=multi30k \
      --config.train.num_steps=2000 --output_dir=runs/ablation_multi30k
  # any k: python -m relpos.experiments.run --table=k_sweep --rows=k=3,k=8 ...
  python -m relpos.experiments.run --list     # the tables, their rows, the tasks, the variants
  # a position variant of your own (a module registering it) as a row of the ablation table:
  python -m relpos.experiments.run --import=my_variant.py --rows=abs,rel_kv,my_variant ...
  # four runs at once on one accelerator, each a process with a quarter of 90% of its memory:
  python -m relpos.experiments.run --table=k_sweep --task=synthetic --seeds=3 --parallel=4 \
      --output_dir=runs/k_sweep_synthetic

Rerunning the same command skips finished runs and resumes an interrupted one; a finished run
made with another config stops it before any work (or, with --retrain_changed, is trained
again). A second table on the same --output_dir is refused. A run that fails is named with
its error (or, in a process of its own, its log), the others go on, and the exit status is 1.

A long table on a shared machine (hours per run): start it detached and at low priority, with
its output folder outside the source tree; rerun the same command after any stop, and the same
command with --status (or --output_dir alone with --status) to see where it stands:
  setsid nice -n 19 python -m relpos.experiments.run --table=ablation --task=multi30k_gpu \
      --rows=rel_kv,abs,none --seeds=3 --order=seeds --set=model.dtype=float32 \
      --output_dir=$HOME/relpos-runs/multi30k >> $HOME/relpos-runs/multi30k.log 2>&1 &
  python -m relpos.experiments.run --output_dir=$HOME/relpos-runs/multi30k --status
"""

import os
import sys
from collections.abc import Sequence

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from relpos import cli
from relpos import variants
from relpos.experiments import children
from relpos.experiments import runner
from relpos.experiments import status
from relpos.experiments import tables

_IMPORT = cli.define_import_flag()  # first: its variants become rows and config fields
_TABLE = flags.DEFINE_enum("table", "ablation", list(tables.TABLES), "Which table to run.")
_TASK = flags.DEFINE_enum("task", tables.DEFAULT_TASK, list(tables.TASKS), "Which task.")
_SEEDS = flags.DEFINE_integer("seeds", 1, "Number of seeds per row (seeds 0..N-1).")
_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Output directory (required to run).")
_ROWS = flags.DEFINE_list(
    "rows", None, "Subset of the table's rows (default: all); the k sweep "
    "takes any k=<int>.")
_CONFIG = cli.define_overrides_flag(
    tables.task_config(tables.DEFAULT_TASK), "Overrides for every run: --config.<field>=<value>, "
    "as train.py takes them.")
_SET = flags.DEFINE_multi_string(
    "set", [], "Alias of --config.<field>=<value>: `--set=dotted.field=value` (Python literal).")
_ORDER = flags.DEFINE_enum(
    "order", "rows", list(runner.ORDERS), "The order of the runs: 'rows' (each row's seeds one "
    "after another) or 'seeds' (every row with seed 0, then every row with seed 1, ...: a whole "
    "table of one seed first).")
_RETRAIN_CHANGED = flags.DEFINE_bool(
    "retrain_changed", False, "Train again the finished runs whose saved config differs from "
    "this command's in a field that changes a result (their folders are renamed to "
    "<name>.replaced-<time>, never deleted); without it such a run stops the table before any "
    "work.")
_STACK_SEEDS = flags.DEFINE_bool(
    "stack_seeds", False, "Train each row's pending seeds as one program (relpos.seed_stack: "
    "their states stacked, one compiled step over every seed), then evaluate each as usual; "
    "the runs' files and results are those of seeds trained alone. With --parallel=1 only.")
_RESTORE_FROM = flags.DEFINE_string(
    "restore_from", None, "A results.json of this table kept elsewhere (e.g. "
    "docs/results/<table>/results.json): its finished runs whose folders --output_dir lacks "
    "count as finished (their result.json and published test translations written back, marked "
    "restored) instead of training again; for an output folder that was lost. Their checkpoints "
    "are not restored.")
_PUBLISH_TO = flags.DEFINE_string(
    "publish_to", None, "A folder to copy results.json, table.md, the plots and each finished "
    "run's test translations into after every finished run (e.g. docs/results/<table>, to "
    "commit): what --restore_from reads back if --output_dir is lost. The runs in flight go "
    "there too (in_flight.json: each one's step and newest checkpoint), when the table stops or "
    "ends and with --status: after a loss, --restore_from records them as trained again from "
    "step 0, and table.md says so.")
_LIST = flags.DEFINE_bool(
    "list", False, "List the tables, their rows, the tasks, and the position variants "
    "(model.position) with their fields, and exit.")
_STATUS = flags.DEFINE_bool(
    "status", False, "Print where the table in --output_dir stands (whether it runs; each run's "
    "state, step, newest checkpoint, best validation BLEU, test BLEU and training time left) "
    "and exit: the table's own command with --status added, or --output_dir alone (the table, "
    "task, rows and seeds then read from its runs' names); safe while it runs. With --publish_to, "
    "writes the runs in flight there (in_flight.json).")
_PARALLEL = flags.DEFINE_integer(
    "parallel", 1, "Runs at once: 1 trains them one after another in this process; N > 1 "
    f"starts each as a child process with {children.MEMORY_FRACTION}/N of the accelerator memory.",
    lower_bound=1)
flags.declare_key_flag(_IMPORT)  # --help lists it (--config, the whole config, is left to --list)


def listing() -> str:
  """The tables with their rows, and the tasks, one per line; then each position variant with
  its fields (with --import, the user's too), one field per line: model.<name>=<default> and
  its doc."""
  lines = [f"table {table}: {tables.rows_text(table)}" for table in tables.TABLES]
  lines += [
      f"tasks: {', '.join(tables.TASKS)}", "position variants (model.position), their fields:"
  ]
  for name in variants.names():
    own = variants.get(name).fields.items()
    lines += [f"  {name}" + ("" if own else ": no fields")]
    lines += [f"    model.{field}={spec.default!r}: {spec.doc}" for field, spec in own]
  return "\n".join(lines)


def overrides() -> dict[str, object]:
  """The --config.<field> overrides of the command line, then the --set ones."""
  given = dict(config_flags.get_override_values(flags.FLAGS["config"]))
  return {**given, **dict(tables.parse_override(s) for s in _SET.value)}


def main(argv: Sequence[str]) -> None:
  if _LIST.value:
    print(cli.run(argv, listing))  # a user's variant named like a row: one line, no traceback
    return
  if not _OUTPUT_DIR.value:
    sys.exit("error: --output_dir is required (where runs, results.json and table.md go).")
  if _ROWS.present and not _ROWS.value:  # `--rows=$ROWS` with ROWS unset
    sys.exit("error: --rows is empty: name at least one row, or leave the flag out for all of "
             "the table's rows.")

  if _STATUS.value:

    def report() -> str:
      asked = {
          "table": _TABLE.value, "task": _TASK.value, "rows": _ROWS.value, "seeds": _SEEDS.value
      }
      given = {name for name in asked if flags.FLAGS[name].present}
      folder = status.table_in_folder(_OUTPUT_DIR.value,
                                      **{name: asked[name] for name in given & {"table", "task"}})
      if not given and folder is None:
        raise ValueError(f"{_OUTPUT_DIR.value} holds no runs of a table: give the table's own "
                         f"command with --status.")
      note = ""
      if folder is not None and given != set(asked):  # what is not given, from the folder's runs
        asked.update((name, value) for name, value in folder.items() if name not in given)
        note = "\n\n" + status.inferred_note(_OUTPUT_DIR.value)
      runs = runner.table_runs(asked["table"], asked["task"],
                               runner.table_rows(asked["table"], asked["rows"]),
                               range(asked["seeds"]), _OUTPUT_DIR.value, _ORDER.value)
      if _PUBLISH_TO.value:
        if written := status.publish_in_flight(_PUBLISH_TO.value, runs, _OUTPUT_DIR.value):
          note += f"\n\nWrote the runs in flight to {written} (commit it with the results)."
      return status.report(asked["table"], asked["task"], runs, _OUTPUT_DIR.value) + note

    print(cli.run(argv, report))
    return

  if _PARALLEL.value > 1:
    children.free_accelerator_memory()  # before any JAX call

  def publish_in_flight() -> None:
    try:
      runs = runner.table_runs(_TABLE.value, _TASK.value,
                               runner.table_rows(_TABLE.value, _ROWS.value), range(_SEEDS.value),
                               _OUTPUT_DIR.value, _ORDER.value)
      status.publish_in_flight(_PUBLISH_TO.value, runs, _OUTPUT_DIR.value)
    except (OSError, ValueError) as e:  # never in the way of what the table itself reports
      logging.warning("Could not publish the runs in flight to %s: %s", _PUBLISH_TO.value, e)

  def table() -> dict[str, object]:
    try:
      return runner.run_table(_TABLE.value, task=_TASK.value, seeds=range(_SEEDS.value),
                              output_dir=_OUTPUT_DIR.value, rows=_ROWS.value, overrides=overrides(),
                              parallel=_PARALLEL.value, order=_ORDER.value,
                              retrain_changed=_RETRAIN_CHANGED.value,
                              stack_seeds=_STACK_SEEDS.value, restore_from=_RESTORE_FROM.value,
                              publish_to=_PUBLISH_TO.value)
    finally:  # ended, stopped (SIGTERM, Ctrl-C) or failed: its runs in flight beside its results
      if _PUBLISH_TO.value and os.path.isdir(_OUTPUT_DIR.value):
        publish_in_flight()

  outputs = cli.run(argv, table)  # Ctrl-C: "interrupted: saved step N ...; run ... again"
  print(outputs["table"])
  print("Wrote", ", ".join([outputs["results"], *outputs["plots"]]))
  if outputs.get("published"):
    print(f"Copied them and the runs' test translations to {_PUBLISH_TO.value}.")
  if outputs["preempted"]:
    print("relpos: stopped; rerun the same command to resume.")
  if outputs["failed"]:
    sys.exit(f"error: {len(outputs['failed'])} run(s) failed, left out of the table: "
             f"{'; '.join(outputs['failed'])}")


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
