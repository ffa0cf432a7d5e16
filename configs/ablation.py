"""Ablation rows (Shaw et al. 2018, Tables 1 and 3, and later position methods) and the k sweep,
as a config file: the rows and tasks are defined in `relpos.experiments.tables`.

Select a row, and optionally the task, in the config string:

  --config=configs/ablation.py:rel_kv            # synthetic task (configs/default.py)
  --config=configs/ablation.py:rel_k,multi30k    # Multi30K model and data (configs/multi30k.py)
  --config=configs/ablation.py:rel_k,multi30k_gpu  # the Multi30K GPU recipe
  --config=configs/ablation.py:rel_k,tiny        # the tiny smoke-test config
  --config=configs/ablation.py:k=4,wmt14         # Table 2 sweep point on the WMT14 base model

(the task's model, vocabulary and lengths come with it: name the task here rather than
overriding `task.name`, which keeps the synthetic ones). A sweep over the clipping distance runs
`k=<k>` for every k in `tables.K_GRID`.
"""
import ml_collections

from relpos.experiments import tables


def get_config(config_string: str | None = None) -> ml_collections.ConfigDict:
  """Returns the config of one row: `"<row>"` or `"<row>,<task>"`.

  Args:
    config_string: a row of `tables.ROWS` or `k=<int>`, optionally followed by `,` and a task
      of `tables.TASKS` (default synthetic). Required: a file named without a row would train
      some row the command does not say.

  Raises:
    ValueError: for no row, an unknown row or task, or too many parts.
  """
  if not config_string:
    raise ValueError("configs/ablation.py needs a row: configs/ablation.py:<row> or "
                     f"configs/ablation.py:<row>,<task>; rows: {tables.row_names_text()}.")
  parts = config_string.split(",")
  if len(parts) > 2:
    raise ValueError(f"ablation config string {config_string!r}: expected '<row>' or "
                     "'<row>,<task>'.")
  row, task = (parts + [tables.DEFAULT_TASK])[:2]
  if task not in tables.TASKS:
    raise ValueError(f"ablation config string {config_string!r}: unknown task {task!r}; "
                     f"allowed: {', '.join(tables.TASKS)}.")
  return tables.row_config(row, task)
