r"""Runs a table of experiments: every row and seed, then results.json, table.md and plots.

  python -m relpos.experiments.run --table=ablation --task=synthetic --seeds=3 \
      --output_dir=runs/ablation_synthetic
  python -m relpos.experiments.run --table=k_sweep --task=synthetic --seeds=3 \
      --output_dir=runs/k_sweep_synthetic
  # a reduced budget on every run:
  python -m relpos.experiments.run --table=ablation --rows=abs,rel_kv,none --task=multi30k \
      --set=train.num_steps=2000 --output_dir=runs/ablation_multi30k

Rerunning the same command skips finished runs and resumes an interrupted one.
"""

import ast
from collections.abc import Sequence

from absl import app
from absl import flags

from relpos import cli
from relpos.experiments import runner

_TABLE = flags.DEFINE_enum("table", "ablation", list(runner.TABLES), "Which table to run.")
_TASK = flags.DEFINE_enum("task", "synthetic", list(runner.EVAL_SPLITS), "Which task.")
_SEEDS = flags.DEFINE_integer("seeds", 1, "Number of seeds per row (seeds 0..N-1).")
_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Output directory.", required=True)
_ROWS = flags.DEFINE_list("rows", None, "Subset of the table's rows (default: all).")
_SET = flags.DEFINE_multi_string(
    "set", [], "Config override for every run, `dotted.field=value` (Python literal).")


def parse_override(text: str) -> tuple[str, object]:
  """`"train.num_steps=100"` -> ("train.num_steps", 100); non-literals stay strings."""
  if "=" not in text:
    raise ValueError(f"--set {text!r}: expected dotted.field=value.")
  field, value = text.split("=", 1)
  try:
    return field, ast.literal_eval(value)
  except (ValueError, SyntaxError):
    return field, value


def main(argv: Sequence[str]) -> None:
  outputs = cli.run(argv, lambda: runner.run_table(
      _TABLE.value, task=_TASK.value, seeds=range(_SEEDS.value), output_dir=_OUTPUT_DIR.value,
      rows=_ROWS.value, overrides=dict(parse_override(s) for s in _SET.value)))
  print(outputs["table"])
  print("Wrote", outputs["results"], "and", ", ".join(outputs["plots"]))


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
