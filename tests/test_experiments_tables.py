"""Tests for relpos.experiments.tables: the rows of the tables, the tasks' configs loaded by
path, a run's config and the `--set` overrides."""
import os
import subprocess
import sys

import pytest

from relpos import source_tree
from relpos import variants

from relpos.experiments import tables


def test_every_task_config_loads_by_path_and_leaves_no_module_behind():
  names = {task: tables.task_config(task).task.name for task in tables.TASKS}
  assert names == {
      "synthetic": "synthetic", "multi30k": "multi30k", "multi30k_gpu": "multi30k",
      "tiny": "synthetic", "wmt14": "wmt14"
  }
  assert tables.task_config("tiny").model.emb_dim < tables.task_config("synthetic").model.emb_dim
  with pytest.raises(ValueError, match=r"^unknown task 'iwslt'; allowed: synthetic, multi30k, "):
    tables.task_config("iwslt")
  assert not any(name.startswith("relpos_task_config_") for name in sys.modules)


def test_the_library_imports_no_config_module():
  """configs/ imports the library (configs/ablation.py reads the rows here), never the reverse."""
  program = ("import sys\n"
             "from relpos.experiments import plots, report, run, runner, tables\n"
             "assert not [m for m in sys.modules if m.split('.')[0] == 'configs'], sys.modules\n")
  done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                        check=False, cwd=source_tree.ROOT, timeout=300,
                        env={**os.environ, "PYTHONPATH": source_tree.ROOT})
  assert done.returncode == 0, done.stderr[-2000:]


def test_a_row_of_a_table():
  assert tables.row_config("rel_k", "synthetic").model.relative_value is False
  assert tables.row_in_table("k=7", "k_sweep") and not tables.row_in_table("k=7", "ablation")
  assert tables.row_in_table("fire",
                             "ablation") and tables.TABLES["ablation"] == (tables.ABLATION_ROWS)
  with pytest.raises(ValueError, match="unknown ablation row 'rel_q'"):
    tables.row_config("rel_q", "synthetic")


def test_a_variant_of_ones_own_named_like_a_row_is_refused(variant_registry):  # pylint: disable=unused-argument
  """`--rows=rel_k` ran Shaw et al.'s row in its place, without a word."""
  class RelK(variants.Variant):
    pass

  variants.register("rel_k")(RelK)
  with pytest.raises(
      ValueError, match=r"^position variant 'rel_k' \(.*test_experiments_tables.py\) is named "
      r"like the table row 'rel_k' .*; register it under a name of its own to run it as a row\.$"):
    tables.row_config("rel_k", "synthetic")


def test_every_row_a_table_names_is_one_it_takes():
  """--list and a wrong row's error name every row a table takes (rows_text), and only those."""
  for table in ("ablation", "length"):
    named = tables.rows_text(table).replace(" (with --rows also:", ",").rstrip(")").split(", ")
    assert sorted(named) == sorted(tables.ROWS), table
    assert all(tables.row_in_table(row, table) for row in named)
  assert tables.more_rows("ablation") == ("fire", "shape", "randomized", "rel_kv_concat")
  assert tables.rows_text("k_sweep").endswith("k=256 (or any k=<int>)")
  assert not tables.row_in_table("rel_q", "ablation") and not tables.more_rows("k_sweep")


def test_the_length_table_rows_and_their_task_fields():
  assert tables.TABLES["length"] == ("abs", "rel_kv", "t5", "rope", "alibi", "fire", "shape",
                                     "randomized", "rel_kv_concat")
  assert tables.row_in_table("rel_k", "length") and not tables.row_in_table("k=4", "length")
  config = tables.one_run_config("rel_kv_concat", 2, "synthetic", {"train.num_steps": 3})
  assert (config.seed, config.train.num_steps) == (2, 3)
  assert (config.model.position, config.task.concat_probability) == ("relative", 0.5)
  override = tables.one_run_config("rel_kv_concat", 0, "synthetic",
                                   {"task.concat_probability": 0.0})  # the command line wins
  assert override.task.concat_probability == 0.0


def test_the_length_table_scores_test_long_seen_on_the_synthetic_task_unless_told_otherwise():
  assert tables.with_table_fields("length",
                                  "synthetic") == {"task.synthetic.num_test_long_seen": 500}
  assert tables.with_table_fields("length", "synthetic",
                                  {"task.synthetic.num_test_long_seen": 0}) == {
                                      "task.synthetic.num_test_long_seen": 0
                                  }  # the command line wins
  assert tables.with_table_fields("ablation", "synthetic", {"seed": 1}) == {"seed": 1}
  assert tables.with_table_fields("length", "multi30k") == {}
  # A run with the split or without it is made as its recipe (an extra split changes no other
  # result); another size of it is not.
  config = tables.one_run_config("abs", 0, "synthetic",
                                 tables.with_table_fields("length", "synthetic"))
  run = {"row": "abs", "seed": 0, "task": "synthetic", "config": config.to_dict()}
  assert tables.recipe_differences({**run, "table": "length"}) == []
  assert tables.recipe_differences({**run, "table": "ablation"}) == []
  config.task.synthetic.num_test_long_seen = 1000
  assert tables.recipe_differences({**run, "config": config.to_dict(), "table": "length"
                                   }) == [("task.synthetic.num_test_long_seen", 500, 1000)]


@pytest.mark.parametrize(
    "rows,field,value,row,own",
    [
        (tables.TABLES["k_sweep"], "model.max_relative_position", 16, "k=0", 0),
        (("k=4",), "model.max_relative_position", 16, "k=4", 4),  # its name states the value
        (("abs", "rel_kv"), "model.relative_value", False, "rel_kv", True),  # rel_k named rel_kv
        (("rel_kv", "abs_rel_kv"), "model.relative_value", False, "rel_kv", True),  # set alike
        (tables.TABLES["length"], "task.concat_probability", 0.25, "rel_kv_concat", 0.5),
        (("abs", "shape"), "model.absolute_type", "learned", "abs", "sinusoidal"),
        (("rel_kv", "rel_k"), "model.position", "rope", "rel_kv", "relative"),
        (("rel_kv", "rel_k"), "model.position", "kerple", "rel_kv", "relative"),  # one's own
        (("rel_kv",), "model.position", "rope", "rel_kv", "relative"),  # alone, not a study
    ])
def test_an_override_of_a_field_a_row_sets_is_refused(rows, field, value, row, own):
  with pytest.raises(ValueError) as raised:
    tables.check_overrides(rows, {field: value})
  assert str(raised.value) == (
      f"--set {field}={value!r} would change row {row}, which sets {field}={own!r}: the table "
      "would compare it under a name it no longer has. Run that row without it, or that row "
      "alone (a study of its settings), or train that config with train.py.")


def test_overrides_that_leave_every_row_what_its_name_says():
  for rows, overrides in (
      (("rel_kv_concat",), {"task.concat_probability": 0.25}),  # a study of one row
      (("fire",), {"model.fire_hidden": 64}),
      (tables.TABLES["ablation"], {"model.max_relative_position": 8, "model.dtype": "float32"}),
      (("rel_kv", "rel_k"), {"model.position": "relative"}),  # the rows' own value
      (("k=4",), {"model.max_relative_position": 4, "train.num_steps": 10}),
      (tables.TABLES["k_sweep"], None),
  ):
    tables.check_overrides(rows, overrides)


@pytest.mark.parametrize("field, value, flag", [("seed", 5, "--seeds"),
                                                ("task.name", "multi30k", "--task")])
def test_an_override_of_a_field_the_table_sets_is_refused(field, value, flag):
  """`--set=seed=5` trained every seed of a row with seed 5: one training, "± 0.0", p = 0."""
  with pytest.raises(
      ValueError, match=(rf"^--set {field}={value!r}: a table sets {field} for "
                         rf"each run itself; use {flag}")):
    tables.check_overrides(("abs", "rel_kv"), {field: value})


def test_an_override_of_a_field_no_row_has_is_refused():
  with pytest.raises(ValueError) as raised:
    tables.check_overrides(("abs", "rope"), {"model.max_relative_position": 8})
  assert str(raised.value) == (
      "override model.max_relative_position=8: a field of position variant 'relative', not of the "
      "rows' variants 'absolute' (fields: absolute_type), 'rope' (fields: rope_base): it would "
      "change nothing.")


def test_parse_override():
  assert tables.parse_override("train.num_steps=100") == ("train.num_steps", 100)
  assert tables.parse_override("task.name=multi30k") == ("task.name", "multi30k")
  assert tables.parse_override("model.relative_key=False") == ("model.relative_key", False)
  with pytest.raises(ValueError, match="dotted.field=value"):
    tables.parse_override("train.num_steps")
  for field, value in (("a.b", 0.1), ("a.b", "x y"), ("a.b", (1, 2)), ("a.b", "3")):
    assert tables.parse_override(tables.format_override(field, value)) == (field, value)
