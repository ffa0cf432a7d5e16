"""What the tables run: their rows (Shaw et al. 2018, Tables 1 and 3, later position methods,
the length-extrapolation interventions and the k sweep), the tasks they run on (a config file
of configs/ each, loaded by path) and the config of one (row, seed) with `--set` overrides.

A row sets all the position fields it depends on, so it means the same thing whatever the base
config. A row may also set fields outside `config.model` (`ROW_FIELDS`, dotted names):
`rel_kv_concat` is rel_kv trained on sentence concatenation (`task.concat_probability`).
"""
import ast
import importlib.util
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections

from relpos import config_changes
from relpos import model_config
from relpos import run_config
from relpos import source_tree
from relpos import variants

# Clipping distances of the paper's Table 2 (relative positions only, no absolute).
K_GRID = (0, 1, 2, 4, 16, 64, 256)
# A k sweep row: k=<int>, rel_kv with that clipping distance.
K_PREFIX = "k="

_RELATIVE_ONLY = {"position": "relative", "add_absolute": False}

# Row name -> `config.model` overrides.
ROWS: dict[str, dict[str, object]] = {
    "abs": {"position": "absolute", "absolute_type": "sinusoidal", "add_absolute": False},
    "rel_kv": {**_RELATIVE_ONLY, "relative_key": True, "relative_value": True},
    "rel_k": {**_RELATIVE_ONLY, "relative_key": True, "relative_value": False},
    "rel_v": {**_RELATIVE_ONLY, "relative_key": False, "relative_value": True},
    "none": {"position": "none", "add_absolute": False},
    "t5": {"position": "t5", "add_absolute": False},
    "abs_rel_kv": {
        "position": "relative", "add_absolute": True, "absolute_type": "sinusoidal",
        "relative_key": True, "relative_value": True
    },
    "rope": {"position": "rope", "add_absolute": False},
    "alibi": {"position": "alibi", "add_absolute": False},
    # Length extrapolation (docs/length.md). SHAPE's shift and randomized positions' range and
    # evaluation stride were chosen by validation BLEU on the synthetic task (seed 0, 1,000 steps;
    # docs/results.md): the papers' values (K = 500; L = 2048 at stride 1) train to 36.6 and
    # 23.5 BLEU on test there. (L = 256 is below wmt14's model.max_len = 512: set it there.)
    "fire": {
        "position": "fire", "add_absolute": False, "fire_hidden": 32, "fire_init_c": 0.1,
        "fire_init_threshold": 16.0
    },
    "shape": {
        "position": "shape", "add_absolute": False, "absolute_type": "sinusoidal",
        "shape_max_shift": 16
    },
    "randomized": {
        "position": "randomized", "add_absolute": False, "absolute_type": "sinusoidal",
        "randomized_max_position": 256, "randomized_eval_stride": 6
    },
}
ROWS["rel_kv_concat"] = dict(ROWS["rel_kv"])

# Row name -> dotted config fields it sets besides `config.model` (applied after ROWS).
ROW_FIELDS: dict[str, dict[str, object]] = {
    # Half of the training examples joined with a random other one (Kondo et al. 2021).
    "rel_kv_concat": {"task.concat_probability": 0.5},
}

# The rows of the ablation table when none are named: Shaw et al.'s and the later position
# methods. Every row of ROWS can be named (--rows), e.g. the length-extrapolation ones.
ABLATION_ROWS = ("abs", "rel_kv", "rel_k", "rel_v", "none", "t5", "abs_rel_kv", "rope", "alibi")
# The rows of the length table (docs/length.md): the main variants, then the interventions for
# length extrapolation, each beside the row it changes (`LENGTH_BASES`).
LENGTH_ROWS = ("abs", "rel_kv", "t5", "rope", "alibi", "fire", "shape", "randomized",
               "rel_kv_concat")
# (intervention row, the row it is judged against) in the length table: SHAPE and randomized
# positions change absolute sinusoids; concatenation changes rel_kv's data; FIRE replaces T5's
# bucketed bias with a learned function of the distance, and is also set against rel_kv, the
# strongest relative row.
LENGTH_BASES = (("fire", "t5"), ("fire", "rel_kv"), ("shape", "abs"), ("randomized", "abs"),
                ("rel_kv_concat", "rel_kv"))

# Table name -> its rows when none are named.
TABLES: dict[str, tuple[str, ...]] = {
    "ablation": ABLATION_ROWS,
    "k_sweep": tuple(f"{K_PREFIX}{k}" for k in K_GRID),
    "length": LENGTH_ROWS,
}

# Table name -> the row each of its runs is compared with, seed by seed, by paired bootstrap
# (`relpos.experiments.paired`; the table's first row where this one did not run): the paper's
# baseline, absolute positions, and in the k sweep its k = 16.
BASELINE_ROWS = {"ablation": "abs", "length": "abs", "k_sweep": "k=16"}

# (table, task) -> the fields its every run sets, under the command's own overrides
# (`with_table_fields`): the length table scores the synthetic task's long sentences of seen
# constructions too (test_long_seen, docs/length.md).
TABLE_FIELDS = {("length", "synthetic"): {"task.synthetic.num_test_long_seen": 500}}


def with_table_fields(table: str, task: str,
                      overrides: dict[str, Any] | None = None) -> dict[str, Any]:
  """`overrides` (dotted field -> value) over the fields `table` sets on `task` (TABLE_FIELDS)."""
  return {**TABLE_FIELDS.get((table, task), {}), **(overrides or {})}


# Task name -> its base config (model size, data, training budget): a file of configs/.
TASK_CONFIGS = {
    "synthetic": "default.py",
    "multi30k": "multi30k.py",
    "multi30k_gpu": "multi30k_gpu.py",
    "tiny": "tiny.py",  # the synthetic task at smoke-test size
    "wmt14": "wmt14_base.py",
}
TASKS = tuple(TASK_CONFIGS)
DEFAULT_TASK = "synthetic"


def task_config(task: str) -> ml_collections.ConfigDict:
  """The base config of `task`: `get_config()` of its file of configs/ (TASK_CONFIGS), loaded
  by path as `--config=configs/<file>` is.

  Raises:
    ValueError: for an unknown task, naming the allowed ones.
  """
  if task not in TASK_CONFIGS:
    raise ValueError(f"unknown task {task!r}; allowed: {', '.join(TASKS)}.")
  path = os.path.join(source_tree.ROOT, "configs", TASK_CONFIGS[task])
  spec = importlib.util.spec_from_file_location(f"relpos_task_config_{task}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def variant_rows() -> tuple[str, ...]:
  """The registered position variants other than relpos's own (a user's, imported with
  --import): each is a row of its own name, with its fields at their defaults.

  Raises:
    ValueError: one is named like a row of `ROWS`, which `--rows` would run in its place.
  """
  own = tuple(name for name in variants.names() if name not in variants.BUILT_IN)
  for name in own:
    if name in ROWS:
      raise ValueError(f"position variant {name!r} ({variants.origin(variants.get(name))}) is "
                       f"named like the table row {name!r} ({ROWS[name]}); register it under "
                       f"a name of its own to run it as a row.")
  return own


def row_overrides(row: str) -> dict[str, object]:
  """`config.model` overrides of a row: a name of `ROWS`, `k=<int>` (rel_kv with that k), or a
  name of `variant_rows()`.

  Raises:
    ValueError: for an unknown row name or a malformed k (or from `variant_rows`).
  """
  own_variants = variant_rows()  # refuses one named like a row of ROWS
  if row in ROWS:
    return dict(ROWS[row])
  if row in own_variants:
    return {"position": row, "add_absolute": False}
  if row.startswith(K_PREFIX):
    k = row[len(K_PREFIX):]
    if not k.isdigit():
      raise ValueError(f"row {row!r}: k must be a non-negative integer, e.g. 'k=4'.")
    return {**ROWS["rel_kv"], "max_relative_position": int(k)}
  raise ValueError(f"unknown ablation row {row!r}; allowed: {row_names_text()}; a variant of "
                   f"your own: --import=<its module>.")


def canonical_row(row: str) -> str:
  """`row` as a table names it: a k sweep row's k without leading zeros (`k=03` -> `k=3`)."""
  k = row[len(K_PREFIX):]
  return K_PREFIX + str(int(k)) if row.startswith(K_PREFIX) and k.isdigit() else row


def row_names_text() -> str:
  """Every row a config can name, as errors list them: the rows of `ROWS`, the registered
  variants' rows, and k=<int>."""
  return (f"{', '.join((*ROWS, *variant_rows()))} or k=<int> (the paper's grid: "
          f"{', '.join(map(str, K_GRID))})")


def more_rows(table: str) -> tuple[str, ...]:
  """Rows `table` runs only when named (--rows), beyond its default ones: for the ablation and
  length tables every other row of `ROWS` and every other registered position variant (a row
  of its own name); for the k sweep none (it takes any `k=<int>` instead)."""
  if table == "k_sweep":
    return ()
  return tuple(row for row in (*ROWS, *variant_rows()) if row not in TABLES[table])


def rows_text(table: str) -> str:
  """The rows of `table` as --list and its errors name them: the default ones, then the rest."""
  text = ", ".join(TABLES[table])
  if table == "k_sweep":
    return f"{text} (or any k=<int>)"
  more = more_rows(table)
  return f"{text} (with --rows also: {', '.join(more)})" if more else text


def row_in_table(row: str, table: str) -> bool:
  """Whether `row` belongs to `table`: one of its default rows or `more_rows`; for the k sweep
  any `k=<int>`."""
  if table == "k_sweep" and row.startswith(K_PREFIX):
    row_overrides(row)  # a malformed k raises, naming the row
    return True
  return row in TABLES[table] or row in more_rows(table)


def row_fields(row: str) -> dict[str, object]:
  """Every field `row` sets, by dotted name: its `config.model` ones and its `ROW_FIELDS`."""
  return {
      **{f"model.{name}": value for name, value in row_overrides(row).items()},
      **ROW_FIELDS.get(row, {})
  }


# Fields a table sets for each run from its own flags: an override would give every run one
# value (every seed one training, the runs filed under another task's name).
TABLE_SET_FIELDS = {"seed": "--seeds (seeds 0..N-1)", "task.name": "--task"}


def check_overrides(rows: Sequence[str], overrides: Mapping[str, Any] | None) -> None:
  """Refuses an override that changes a field a requested row sets (`row_fields`): the row
  would no longer be what its name says, and the table would compare it as such
  (`--rows=abs,rel_kv --set=model.relative_value=False` trains rel_k as `rel_kv`;
  `--set=model.max_relative_position=16` on the k sweep trains k=0 and k=256 alike;
  `--set=task.concat_probability=0.25` on the length table concatenates for every row). A
  one-row table may change its row's fields, a study of that row
  (`--rows=rel_kv_concat --set=task.concat_probability=0.25`), but not its variant
  (`model.position`) nor a value its name states (`k=4`); every table may set a field no row
  sets, or set one to the rows' own value.

  An override of a position variant's field that no row's variant has is refused too
  (`model_config.check_fields_used`), and so is one of a field the table sets from its own
  flags (`TABLE_SET_FIELDS`: `--set=seed=5` trained every seed with seed 5).

  Raises:
    ValueError: naming the override and the row whose field it would change.
  """
  overrides = overrides or {}
  study = len(rows) == 1 and not rows[0].startswith(K_PREFIX)  # of one row's settings
  for field, value in overrides.items():
    if field in TABLE_SET_FIELDS:
      raise ValueError(f"--set {field}={value!r}: a table sets {field} for each run itself; use "
                       f"{TABLE_SET_FIELDS[field]}.")
    for row in rows:
      own = row_fields(row)
      if field in own and own[field] != value and not (study and field != "model.position"):
        raise ValueError(
            f"--set {field}={value!r} would change row {row}, which sets {field}={own[field]!r}: "
            "the table would compare it under a name it no longer has. Run that row without "
            "it, or that row alone (a study of its settings), or train that config with train.py.")
  model_config.check_fields_used(
      {k.removeprefix("model."): v for k, v in overrides.items() if k.startswith("model.")},
      [row_overrides(row)["position"] for row in rows], "override model.")


def row_config(row: str, task: str) -> ml_collections.ConfigDict:
  """The config of `row` on `task`: the task's base config with the row's fields.

  Raises:
    ValueError: for an unknown row or task.
  """
  config = task_config(task)
  config.model.update(row_overrides(row))
  run_config.set_fields(config, ROW_FIELDS.get(row, {}))
  return config


def one_run_config(row: str, seed: int, task: str,
                   overrides: dict[str, Any] | None = None) -> ml_collections.ConfigDict:
  """The config of one run: the row on `task`, seeded, with dotted-key overrides.

  Raises:
    ValueError: for an unknown row, task or override field, or an override of another type.
  """
  config = row_config(row, task)
  config.seed = seed
  run_config.set_fields(config, overrides or {})
  return config


def parse_override(text: str) -> tuple[str, Any]:
  """`"train.num_steps=100"` -> ("train.num_steps", 100); non-literals stay strings."""
  if "=" not in text:
    raise ValueError(f"--set {text!r}: expected dotted.field=value.")
  field, value = text.split("=", 1)
  try:
    return field, ast.literal_eval(value)
  except (ValueError, SyntaxError):
    return field, value


def format_override(field: str, value: Any) -> str:
  """The `--set` text that `parse_override` reads back as (field, value)."""
  return f"{field}={value!r}"


def recipe_differences(run: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
  """How a run of a results.json (its "row", "seed", "task" and "config") was made otherwise
  than its row's recipe (`one_run_config` without overrides), in the fields that change a
  result: [(dotted field, the recipe's value, the run's)]. Warnings about fields its config
  predates are left out (they say the same thing); [] for a run whose config no longer
  validates (a variant of one's own not imported).
  """
  absl_logger = logging.getLogger("absl")
  level = absl_logger.level
  absl_logger.setLevel(logging.ERROR)
  try:
    saved = run_config.validate(run["config"])
    recipe = run_config.validate(
        one_run_config(run["row"], run["seed"], run["task"],
                       with_table_fields(run["table"], run["task"])))
  except ValueError:
    return []
  finally:
    absl_logger.setLevel(level)
  return config_changes.result_differences(recipe, saved)
