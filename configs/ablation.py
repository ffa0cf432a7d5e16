"""Ablation rows (Shaw et al. 2018, Tables 1 and 3, and later position methods) and the k sweep.

Select a row, and optionally the task, in the config string:

  --config=configs/ablation.py:rel_kv            # synthetic task (configs/default.py)
  --config=configs/ablation.py:rel_k,multi30k    # Multi30K model and data (configs/multi30k.py)
  --config=configs/ablation.py:rel_k,multi30k_gpu  # the Multi30K GPU recipe
  --config=configs/ablation.py:rel_k,tiny        # the tiny smoke-test config
  --config=configs/ablation.py:k=4,wmt14         # Table 2 sweep point on the WMT14 base model

or override the task afterwards (`--config.task.name=...`). A sweep over the clipping distance
runs `k=<k>` for every k in `K_GRID`. Each row sets all the position fields it depends on, so a
row means the same thing whatever the base config. A row may also set fields outside
`config.model` (`ROW_FIELDS`, dotted names): `rel_kv_concat` is rel_kv trained on sentence
concatenation (`task.concat_probability`).
"""
from typing import Any

import ml_collections

from configs import default
from configs import multi30k
from configs import multi30k_gpu
from configs import tiny
from configs import wmt14_base
from relpos import variants

# Clipping distances of the paper's Table 2 (relative positions only, no absolute).
K_GRID = (0, 1, 2, 4, 16, 64, 256)

_RELATIVE_ONLY = {"position": "relative", "add_absolute": False}

# Row name -> `config.model` overrides.
ROWS: dict[str, dict[str, object]] = {
    "abs": {"position": "absolute", "absolute_type": "sinusoidal", "add_absolute": False},
    "rel_kv": {**_RELATIVE_ONLY, "relative_key": True, "relative_value": True},
    "rel_k": {**_RELATIVE_ONLY, "relative_key": True, "relative_value": False},
    "rel_v": {**_RELATIVE_ONLY, "relative_key": False, "relative_value": True},
    "none": {"position": "none", "add_absolute": False},
    "t5": {"position": "t5", "add_absolute": False},
    "abs_rel_kv": {"position": "relative", "add_absolute": True, "absolute_type": "sinusoidal",
                   "relative_key": True, "relative_value": True},
    "rope": {"position": "rope", "add_absolute": False},
    "alibi": {"position": "alibi", "add_absolute": False},
    # Length extrapolation (issue #27): FIRE, SHAPE and randomized positions at their defaults.
    "fire": {"position": "fire", "add_absolute": False, "fire_hidden": 32, "fire_init_c": 0.1,
             "fire_init_threshold": 16.0},
    "shape": {"position": "shape", "add_absolute": False, "absolute_type": "sinusoidal",
              "shape_max_shift": 500},
    "randomized": {"position": "randomized", "add_absolute": False,
                   "absolute_type": "sinusoidal", "randomized_max_position": 2048,
                   "randomized_eval_stride": 1},
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
# The rows of the length table (issue #27): the main variants, then the interventions for
# length extrapolation, each beside the row it changes (`LENGTH_BASES`).
LENGTH_ROWS = ("abs", "rel_kv", "t5", "rope", "alibi", "fire", "shape", "randomized",
               "rel_kv_concat")
# (intervention row, the row it is judged against) in the length table: SHAPE and randomized
# positions change absolute sinusoids; concatenation changes rel_kv's data; FIRE replaces T5's
# bucketed bias with a learned function of the distance, and is also set against rel_kv, the
# strongest relative row.
LENGTH_BASES = (("fire", "t5"), ("fire", "rel_kv"), ("shape", "abs"), ("randomized", "abs"),
                ("rel_kv_concat", "rel_kv"))

# Task name -> base config (model size and data).
BASES = {
    "synthetic": default.get_config,
    "multi30k": multi30k.get_config,
    "multi30k_gpu": multi30k_gpu.get_config,
    "tiny": tiny.get_config,  # the synthetic task at smoke-test size
    "wmt14": wmt14_base.get_config,
}

_K_PREFIX = "k="


def variant_rows() -> tuple[str, ...]:
  """Registered position variants without a row of `ROWS` named after them (a user's own,
  imported with --import): each is a row of its own name, with its fields at their defaults."""
  taken = set(ROWS) | {row["position"] for row in ROWS.values()}
  return tuple(name for name in variants.names() if name not in taken)


def row_overrides(row: str) -> dict[str, object]:
  """`config.model` overrides of a row: a name of `ROWS`, `k=<int>` (rel_kv with that k), or a
  name of `variant_rows()`.

  Raises:
    ValueError: for an unknown row name or a malformed k.
  """
  if row in ROWS:
    return dict(ROWS[row])
  if row in variant_rows():
    return {"position": row, "add_absolute": False}
  if row.startswith(_K_PREFIX):
    k = row[len(_K_PREFIX):]
    if not k.isdigit():
      raise ValueError(f"ablation row {row!r}: k must be a non-negative integer, e.g. 'k=4'.")
    return {**ROWS["rel_kv"], "max_relative_position": int(k)}
  raise ValueError(f"unknown ablation row {row!r}; allowed: {', '.join((*ROWS, *variant_rows()))} "
                   f"or k=<int> (the paper's grid: {', '.join(map(str, K_GRID))}); a variant of "
                   f"your own: --import=<its module>.")


def set_fields(config: ml_collections.ConfigDict, dotted: dict[str, Any]) -> None:
  """Sets dotted fields of `config` in place, e.g. {"task.concat_probability": 0.5}.

  Raises:
    ValueError: for a field the config lacks, or a value of another type than the field's.
  """
  for name, value in dotted.items():
    parent = config
    *path, leaf = name.split(".")
    for part in path:
      if part not in parent:
        raise ValueError(f"override {name!r}: no config field {part!r}.")
      parent = parent[part]
    if leaf not in parent:
      raise ValueError(f"override {name!r}: no config field {leaf!r}.")
    try:
      parent[leaf] = value
    except TypeError:  # ConfigDict refuses a value of another type
      raise ValueError(f"override {name}={value!r}: the field holds "
                       f"{type(parent[leaf]).__name__} values, e.g. {parent[leaf]!r}.") from None


def get_config(config_string: str = "rel_kv") -> ml_collections.ConfigDict:
  """Returns the config of one row: `"<row>"` or `"<row>,<task>"`.

  Args:
    config_string: a row of `ROWS` or `k=<int>`, optionally followed by `,` and a task of
      `BASES` (default synthetic).

  Raises:
    ValueError: for an unknown row or task, or too many parts.
  """
  parts = config_string.split(",")
  if len(parts) > 2:
    raise ValueError(f"ablation config string {config_string!r}: expected '<row>' or "
                     "'<row>,<task>'.")
  row, task = (parts + ["synthetic"])[:2]
  if task not in BASES:
    raise ValueError(f"ablation config string {config_string!r}: unknown task {task!r}; "
                     f"allowed: {', '.join(BASES)}.")
  config = BASES[task]()
  config.model.update(row_overrides(row))
  set_fields(config, ROW_FIELDS.get(row, {}))
  return config
