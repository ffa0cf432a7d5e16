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


def test_duration_rounds_to_the_nearest_minute_alike_below_and_above_an_hour():
  # 16,790 s is 4 h 39.8 min: "4 h 40 min", as 719 s (11.98 min) is "12 min".
  assert [markdown.duration(s) for s in (59.4, 59.6, 719, 3_569, 3_599, 16_790, 11_564)
         ] == ["59 s", "1 min", "12 min", "59 min", "1 h 00 min", "4 h 40 min", "3 h 13 min"]
