"""Config fields: what each accepts, its default, its doc, and one way to check a section.

A `Field` declares one config field. Every field has one, in one place per section: `task.*`,
`train.*` and `decode.*` in `relpos.run_config`, the architecture's `model.*` fields on
`relpos.model_config.TransformerConfig`, each position variant's own `model.*` fields in its module
(`relpos.variants`). `resolve` checks a section against its fields: a missing field takes its
`absent` value with a warning (a config.json written before the field existed), an unknown
field or an invalid value raises a ValueError that names the field, the value and what is
allowed.
"""
import dataclasses
import difflib
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from absl import logging

SAME = object()  # Field.absent: a config without the field means its default

# What changing a field does (Field.effect): it changes neither what a run trains nor what it
# reports (where data is read from, how often a run logs); it changes the result (a finished run
# is trained again) but may change when a run resumes (the learning rate, decoding); or it may
# not change on resume, because the tokenizer, or the model, would change under the
# checkpoints' parameters, the choice of the best checkpoint and early stopping would compare
# validations measured two ways, or the data position saved with a checkpoint would mean another
# place in the data (DATA: the seed's shuffle order, the examples max_length keeps).
NEUTRAL, RESULT, TOKENIZER, PARAMETERS = "neutral", "result", "tokenizer", "parameters"
SELECTION, DATA = "selection", "data"
# The size of a held-out split scored besides the others (0: no such split): turned on or off it
# changes no other result (a finished run without the split is reused, the split missing from
# its result; an unfinished one resumes and scores it); from one size to another, RESULT.
EXTRA_SPLIT = "extra split"


@dataclasses.dataclass(frozen=True)
class Rule:
  """What a config field accepts.

  Attributes:
    allowed: words for the error message, e.g. "an integer >= 1".
    check: returns True when the value is allowed.
  """
  allowed: str
  check: Callable[[Any], bool]


@dataclasses.dataclass(frozen=True)
class Field:
  """One config field.

  Attributes:
    default: the value of a new config (`relpos.run_config.default_config`).
    rule: what it accepts.
    doc: one line for a reader of the config.
    absent: the value of a saved config that lacks the field (one written before the field
      existed): the value that reproduces that run. SAME: `default`.
    effect: what changing it does (NEUTRAL, RESULT, TOKENIZER, PARAMETERS, SELECTION, DATA,
      EXTRA_SPLIT);
      None: the section's (PARAMETERS for `model.*`, RESULT elsewhere).
  """
  default: Any
  rule: Rule
  doc: str = ""
  absent: Any = SAME
  effect: str | None = None

  def __post_init__(self):
    if not self.rule.check(self.default):
      about = f" (the field of {self.doc!r})" if self.doc else ""
      raise ValueError(f"Field default {self.default!r}{about} is not {self.rule.allowed}.")

  @property
  def value_when_absent(self) -> Any:
    """The value of a saved config that lacks the field."""
    return self.default if self.absent is SAME else self.absent


def _is_int(value: Any) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
  return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def one_of(*values: str) -> Rule:
  return Rule(f"one of {', '.join(map(repr, values))}", lambda v: v in values)


def integer(minimum: int) -> Rule:
  return Rule(f"an integer >= {minimum}", lambda v: _is_int(v) and v >= minimum)


def number(minimum: float, maximum: float = math.inf, *, open_min: bool = False,
           open_max: bool = False) -> Rule:
  """A finite number in an interval, closed unless `open_min` / `open_max`."""
  low, high = "(" if open_min else "[", ")" if open_max or maximum == math.inf else "]"

  def check(v: Any) -> bool:
    if not _is_number(v):
      return False
    above = v > minimum if open_min else v >= minimum
    below = v < maximum if open_max else v <= maximum
    return above and below

  return Rule(f"a number in {low}{minimum}, {maximum}{high}", check)


BOOLEAN = Rule("True or False", lambda v: isinstance(v, bool))
STRING = Rule("a string", lambda v: isinstance(v, str))
NON_EMPTY_STRING = Rule("a non-empty string", lambda v: isinstance(v, str) and bool(v))


def invalid(path: str, value: Any, allowed: str) -> ValueError:
  """The error for a field: "config field <path>=<value> is invalid: must be <allowed>."."""
  return ValueError(f"config field {path}={value!r} is invalid: must be {allowed}.")


def close_names(name: str, known: Sequence[str]) -> list[str]:
  """The names of `known` a mistyped `name` may have meant: those it begins (`concat` for
  `concat_probability`), else the closest by difflib's ratio."""
  return [k for k in known if k.startswith(name)] or difflib.get_close_matches(name, known, n=1)


# A mistyped name this close to a field's (difflib's ratio) is taken for a typo of it alone.
TYPO_RATIO = 0.9


def did_you_mean(candidates: Sequence[str], path: str = "", there: Sequence[str] = ()) -> str:
  """" Did you mean 'x'?" for the first of the names close to a mistyped one, appended to the
  message for a field that does not exist, and a hint at --import when the field's dotted
  `path` is under model. (a field of a position variant of the user's own, forgotten --import:
  `kerple_shared_across_layers` is close to `relative_shared_across_layers`), unless the name
  is a typo of the first (difflib's ratio >= TYPO_RATIO: `num_head` for `num_heads`). With no
  close name, outside model., the fields `there` are (its section's: `train.lr` lists train's,
  among them learning_rate)."""
  meant = f" Did you mean {candidates[0]!r}?" if candidates else ""
  typed = path.rsplit(".", 1)[-1]
  if not candidates and there and not path.startswith("model."):
    whose = f"{path.rsplit('.', 1)[0]}'s" if "." in path else "The config's"
    return f" {whose} fields: {', '.join(sorted(there))}."
  if candidates and difflib.SequenceMatcher(None, typed, candidates[0]).ratio() >= TYPO_RATIO:
    return meant
  if path.startswith("model."):
    own = " Or a" if candidates else " A"
    return (f"{meant}{own} field of a position variant of your own? Pass its module with "
            f"--import first.")
  return meant


def resolve(values: Mapping[str, Any], fields: Mapping[str, Field], section: str, *,
            hint: str = "") -> dict[str, Any]:
  """The checked values of one config section, with defaults for the fields it lacks.

  Args:
    values: the section as given (e.g. `config.model`).
    fields: its fields by name.
    section: its dotted name in messages, e.g. "model" ("" for the top level).
    hint: appended to the message for an unknown field.

  Returns:
    name -> value for every field of `fields`, in their order.

  Raises:
    ValueError: a field that is unknown or invalid.
  """
  def path(name: str) -> str:
    return f"{section}.{name}" if section else name

  unknown = sorted(set(values) - set(fields))
  if unknown:
    meant = close_names(unknown[0], list(fields))
    raise ValueError(f"unknown config field {path(unknown[0])}; {section or 'the config'} has: "
                     f"{', '.join(fields)}.{f' Did you mean {meant[0]!r}?' if meant else ''}"
                     f"{hint}")
  resolved = {}
  for name, field in fields.items():
    if name in values:
      resolved[name] = values[name]
    else:
      logging.warning(
          "config field %s is missing (a config written before it existed): "
          "using %r.", path(name), field.value_when_absent)
      resolved[name] = field.value_when_absent
    if not field.rule.check(resolved[name]):
      raise invalid(path(name), resolved[name], field.rule.allowed)
  return resolved
