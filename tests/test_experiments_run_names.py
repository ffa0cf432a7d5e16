"""Tests for relpos.experiments.run_names: a run's workdir name and its reading back."""
import pytest

from relpos.experiments import run_names
from relpos.experiments import tables


def test_names_are_those_of_published_runs():
  # Restarted tables find their runs by these names: they must never change.
  assert (run_names.run_name("multi30k_gpu", "ablation", "rel_kv",
                             0) == "multi30k_gpu-ablation-rel_kv-seed0")
  assert run_names.run_name("synthetic", "k_sweep", "k=16", 2) == "synthetic-k_sweep-k16-seed2"
  assert (run_names.run_name("synthetic", "length", "rel_kv_concat",
                             1) == "synthetic-length-rel_kv_concat-seed1")


@pytest.mark.parametrize("table", sorted(tables.TABLES))
@pytest.mark.parametrize("task", tables.TASKS)
def test_every_row_reads_back(table, task):
  for row in tables.TABLES[table] + tables.more_rows(table):
    for seed in (0, 12):
      name = run_names.run_name(task, table, row, seed)
      assert run_names.parse_run_name(name) == (task, table, row, seed)


def test_a_row_with_a_separator_reads_back():
  name = run_names.run_name("synthetic", "ablation", "my-variant", 3)
  assert run_names.parse_run_name(name) == ("synthetic", "ablation", "my-variant", 3)


@pytest.mark.parametrize(
    "name",
    [
        "synthetic-ablation-rel_kv-seed0.replaced-20261127T040000",  # moved aside
        "synthetic-k_sweep-rel_kv-seed0",  # a k sweep row not k<int>
        "synthetic-k_sweep-kx-seed0",
        "synthetic-ablation-rel_kv-seedx",
        "synthetic-ablation-rel_kv",
        "ablation-rel_kv-seed0",
        "-ablation-rel_kv-seed0",
        "notes",
    ])
def test_other_names_are_not_runs(name):
  assert run_names.parse_run_name(name) is None


@pytest.mark.parametrize("task,table", [("my-task", "ablation"), ("synthetic", "my-table")])
def test_a_name_with_the_separator_is_refused(task, table):
  with pytest.raises(ValueError, match="holds '-'"):
    run_names.run_name(task, table, "abs", 0)


def test_a_result_is_named_by_its_fields_not_the_folder_it_ran_in():
  result = {
      "task": "synthetic", "table": "k_sweep", "row": "k=4", "seed": 1,
      "workdir": "/elsewhere/runs/k_sweep-k4-seed1"
  }  # published before the task led
  assert run_names.run_name_of(result) == "synthetic-k_sweep-k4-seed1"
