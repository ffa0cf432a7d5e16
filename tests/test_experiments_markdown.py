"""Tests of relpos.experiments.markdown: table.md's markdown tables and durations."""
from relpos.experiments import markdown


def test_table_is_header_separator_and_rows():
  assert markdown.table(["row", "BLEU"], [["abs", "39.0"], ["rel_kv", "40.0"]]) == [
      "| row | BLEU |", "| --- | --- |", "| abs | 39.0 |", "| rel_kv | 40.0 |"
  ]
  assert markdown.table(["row"], []) == ["| row |", "| --- |"]


def test_duration_in_seconds_minutes_or_hours():
  assert [markdown.duration(s) for s in (40, 720, 3720, 14_409)
         ] == ["40 s", "12 min", "1 h 02 min", "4 h 00 min"]
