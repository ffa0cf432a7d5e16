"""Config fields: what each accepts, its default, and one way to check a section of them.

Every field of a run's config has one `Field` in exactly one place: `model.*` architecture
fields in `relpos.model.FIELDS`, each position variant's own fields in its module
(`relpos.variants`), the other sections' in `relpos.config_validation.FIELDS`. `resolve` checks
a section against its fields: a missing field takes its default with a warning (a config.json
written before the field existed), an unknown field or an invalid value raises a ValueError
that names the field, the value and what is allowed.
"""
import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

from absl import logging

REQUIRED = object()  # the default of a field that has none


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
    default: the value of a config that lacks the field, or REQUIRED.
    rule: what it accepts.
    doc: one line for a reader of the config.
  """
  default: Any
  rule: Rule
  doc: str = ""


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


def resolve(values: Mapping[str, Any], fields: Mapping[str, Field], section: str, *,
            hint: str = "") -> dict[str, Any]:
  """The checked values of one config section, with defaults for the fields it lacks.

  Args:
    values: the section as given (e.g. `config.model`).
    fields: its fields by name.
    section: its dotted name in messages, e.g. "model" ("" for the top level).
    hint: appended to the message for an unknown field.

  Returns:
    name -> value for every field of `fields`.

  Raises:
    ValueError: a field that is unknown, missing without a default, or invalid.
  """
  def path(name: str) -> str:
    return f"{section}.{name}" if section else name

  unknown = sorted(set(values) - set(fields))
  if unknown:
    raise ValueError(f"unknown config field {path(unknown[0])}; {section or 'the config'} has: "
                     f"{', '.join(fields)}.{hint}")
  resolved = {}
  for name, field in fields.items():
    if name in values:
      resolved[name] = values[name]
    elif field.default is REQUIRED:
      raise ValueError(f"config field {path(name)} is missing.")
    else:
      logging.warning("config field %s is missing (a config written before it existed): "
                      "using %r.", path(name), field.default)
      resolved[name] = field.default
    if not field.rule.check(resolved[name]):
      raise invalid(path(name), resolved[name], field.rule.allowed)
  return resolved
