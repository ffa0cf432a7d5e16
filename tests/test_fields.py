"""Tests for relpos.fields: the rules a config field accepts, a field's default and its value in
older configs, and checking one section (`resolve`). (Every section's own fields: test_run_config.py
and test_model_config.py.)"""

import math

import pytest

from relpos import fields


def test_rules_accept_what_they_say_and_nothing_else():
  assert fields.integer(1).allowed == "an integer >= 1"
  assert [fields.integer(1).check(v) for v in (1, 7, 0, 1.0, True, "2")
         ] == [True, True, False, False, False, False]
  unit = fields.number(0.0, 1.0, open_max=True)
  assert unit.allowed == "a number in [0.0, 1.0)"
  assert [unit.check(v) for v in (0.0, 0, 0.5, 1.0, -0.1, math.nan, False)
         ] == [True, True, True, False, False, False, False]
  positive = fields.number(0.0, open_min=True)
  assert positive.allowed == "a number in (0.0, inf)"
  assert [positive.check(v) for v in (0.0, 1e-9, 1e30, math.inf)] == [False, True, True, False]
  choice = fields.one_of("raise", "skip")
  assert choice.allowed == "one of 'raise', 'skip'"
  assert [choice.check(v) for v in ("raise", "skip", "ignore", None)] == [True, True, False, False]
  assert [fields.BOOLEAN.check(v) for v in (True, False, 1, "True")] == [True, True, False, False]
  assert [fields.NON_EMPTY_STRING.check(v) for v in ("a", "", None)] == [True, False, False]
  assert [fields.STRING.check(v) for v in ("", "a", 1)] == [True, True, False]


def test_a_field_refuses_a_default_it_does_not_accept():
  with pytest.raises(ValueError, match=r"^Field default 0 is not an integer >= 1\.$"):
    fields.Field(0, fields.integer(1))
  with pytest.raises(
      ValueError, match=r"^Field default -1 \(the field of 'the largest distance'\) is not an "
      r"integer >= 0\.$"):
    fields.Field(-1, fields.integer(0), "the largest distance")


def test_value_when_absent_is_the_default_unless_the_field_says_otherwise():
  assert fields.Field(4, fields.integer(0)).value_when_absent == 4
  assert fields.Field(4, fields.integer(0), absent=1).value_when_absent == 1


SECTION = {
    "steps": fields.Field(10, fields.integer(1), "how many"),
    "mode": fields.Field("raise", fields.one_of("raise", "skip"), absent="skip"),
}


def test_resolve_fills_what_is_missing_in_field_order_and_leaves_its_input_alone(caplog):
  given = {"mode": "raise"}
  assert list(fields.resolve(given, SECTION, "train").items()) == [("steps", 10), ("mode", "raise")]
  assert given == {"mode": "raise"}
  assert fields.resolve({"steps": 3}, SECTION, "train") == {"steps": 3, "mode": "skip"}
  assert ("config field train.mode is missing (a config written before it existed): using "
          "'skip'.") in caplog.text


def test_resolve_names_an_unknown_or_invalid_field_in_one_line():
  with pytest.raises(ValueError) as unknown:
    fields.resolve({"step": 3}, SECTION, "train", hint=" A hint.")
  assert str(unknown.value) == ("unknown config field train.step; train has: steps, mode. "
                                "Did you mean 'steps'? A hint.")
  with pytest.raises(ValueError) as top_level:
    fields.resolve({"sead": 1}, {"seed": fields.Field(0, fields.integer(0))}, "")
  assert str(top_level.value) == ("unknown config field sead; the config has: seed. Did you mean "
                                  "'seed'?")
  with pytest.raises(ValueError) as unlike:
    fields.resolve({"lr": 1}, {"seed": fields.Field(0, fields.integer(0))}, "")
  assert str(unlike.value) == "unknown config field lr; the config has: seed."
  with pytest.raises(ValueError) as invalid:
    fields.resolve({"steps": 0}, SECTION, "train")
  assert str(invalid.value) == "config field train.steps=0 is invalid: must be an integer >= 1."


def test_a_mistyped_name_is_offered_the_names_it_begins_or_the_closest():
  known = ["num_steps", "concat_probability", "batch_size"]
  assert fields.close_names("concat", known) == ["concat_probability"]
  assert fields.close_names("num_step", known) == ["num_steps"]
  assert fields.close_names("learning_rate", known) == []
  assert fields.did_you_mean(["num_steps"]) == " Did you mean 'num_steps'?"
  assert fields.did_you_mean([]) == ""
  # Under model., a forgotten --import is named beside the closest name.
  assert fields.did_you_mean(["relative_shared_across_layers"],
                             "model.kerple_shared_across_layers") == (
                                 " Did you mean 'relative_shared_across_layers'? Or a field of a "
                                 "position variant of your own? Pass its module with --import "
                                 "first.")
  # A typo of a field's name (ratio 0.94) is that field's alone.
  assert fields.did_you_mean(["num_heads"], "model.num_head") == " Did you mean 'num_heads'?"
