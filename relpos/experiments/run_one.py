r"""Trains and evaluates one (row, seed) of a table in its workdir: the child process that
`python -m relpos.experiments.run --parallel=N` starts for each run (`relpos.experiments.runner`).

  python -m relpos.experiments.run_one --table=ablation --row=rel_kv --seed=0 --task=synthetic \
      --workdir=runs/ablation/runs/synthetic-ablation-rel_kv-seed0 --set=train.num_steps=100

On SIGTERM it saves a checkpoint and exits with status 0 without a result; on Linux the table
that starts it has the kernel send it SIGTERM when the table exits (`children.start`), so
a table killed outright does not leave its runs training.
"""

from collections.abc import Sequence

from absl import app
from absl import flags

from relpos import cli
from relpos.experiments import single_run
from relpos.experiments import tables

_IMPORT = cli.define_import_flag()  # the parent's --import, for its variants
_TABLE = flags.DEFINE_enum("table", None, list(tables.TABLES), "The run's table.", required=True)
_ROW = flags.DEFINE_string("row", None, "The run's row of the table.", required=True)
_SEED = flags.DEFINE_integer("seed", 0, "The run's seed.")
_TASK = flags.DEFINE_enum("task", tables.DEFAULT_TASK, list(tables.TASKS), "The run's task.")
_WORKDIR = flags.DEFINE_string("workdir", None, "The run's workdir.", required=True)
_SET = flags.DEFINE_multi_string("set", [],
                                 "Config override, `dotted.field=value` (Python literal).")


def main(argv: Sequence[str]) -> None:
  cli.run(
      argv,
      lambda: single_run.run_one(_TABLE.value, _ROW.value, _SEED.value, _TASK.value, _WORKDIR.value,
                                 dict(tables.parse_override(s) for s in _SET.value)))


if __name__ == "__main__":
  app.run(main)
