"""Validation of a run's config, once at start, before any work.

Every field of `configs/default.py` outside `model.*` has a rule here; `model.*` is
validated by `relpos.model.TransformerConfig` (one source of truth for the architecture).
An invalid value raises a ValueError that names the field, the value and what is allowed.
"""
import dataclasses
import math
import re
from collections.abc import Callable
from typing import Any

import ml_collections
from absl import logging

from relpos import model as model_lib

TASKS = ("synthetic", "multi30k", "wmt14")
# The checkpoint a table scores (and eval.py's named ones): the best by validation BLEU, the
# latest, or the average of the parameters of the last N saved ones (group 1: N).
CHECKPOINT_CHOICE = re.compile(r"best|latest|average:([2-9]|[1-9][0-9]+)")


@dataclasses.dataclass(frozen=True)
class Rule:
  """What a config field accepts.

  Attributes:
    allowed: words for the error message, e.g. "an integer >= 1".
    check: returns True when the value is allowed.
  """
  allowed: str
  check: Callable[[Any], bool]


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

# Field path -> rule, for every field outside `model.*`.
RULES: dict[str, Rule] = {
    "seed": integer(0),
    "task.name": one_of(*TASKS),
    "task.tfds_data_dir": STRING,
    "task.source_lang": NON_EMPTY_STRING,
    "task.target_lang": NON_EMPTY_STRING,
    "task.manual_dir": STRING,
    "task.download_url": STRING,
    "task.vocab_size": integer(8),
    "task.spm_model_type": one_of("unigram", "bpe", "word", "char"),
    "task.spm_seed": integer(0),
    "task.max_length": integer(2),
    "task.overlong": one_of("filter", "truncate"),
    "task.packing": BOOLEAN,
    "task.shuffle_buffer_seed": integer(0),
    "task.synthetic.seed": integer(0),
    "task.synthetic.num_train": integer(1),
    "task.synthetic.num_validation": integer(1),
    "task.synthetic.num_test": integer(1),
    "task.synthetic.num_test_long": integer(1),
    "task.synthetic.min_words": integer(1),
    "task.synthetic.max_words": integer(1),
    "task.synthetic.long_min_words": integer(1),
    "task.synthetic.long_max_words": integer(1),
    "train.batch_size": integer(1),
    "train.grad_accumulation_steps": integer(1),
    "train.num_steps": integer(1),
    "train.learning_rate": number(0.0, open_min=True),
    "train.warmup_steps": integer(1),
    "train.adam_b1": number(0.0, 1.0, open_max=True),
    "train.adam_b2": number(0.0, 1.0, open_max=True),
    "train.adam_eps": number(0.0, open_min=True),
    "train.weight_decay": number(0.0),
    "train.label_smoothing": number(0.0, 1.0, open_max=True),
    "train.grad_clip_norm": number(0.0),
    "train.nonfinite": one_of("raise", "skip"),
    "train.max_skipped_fraction": number(0.0, 1.0),
    "train.log_every_steps": integer(1),
    "train.eval_every_steps": integer(1),
    "train.early_stopping_patience": integer(0),
    "train.checkpoint_every_steps": integer(1),
    "train.keep_checkpoints": integer(1),
    "train.eval_batch_size": integer(1),
    "decode.beam_size": integer(1),
    "decode.alpha": number(0.0),
    "decode.max_decode_len": integer(0),
    "decode.validation_bleu": BOOLEAN,
    "decode.checkpoint": Rule(
        "'best', 'latest' or 'average:<N>' with N >= 2",
        lambda v: isinstance(v, str) and bool(CHECKPOINT_CHOICE.fullmatch(v))),
}

# Fields added after runs were saved, with the value that reproduces those runs: a config.json
# written before a field existed gets it (with a warning) instead of failing to load.
DEFAULTS: dict[str, Any] = {
    "train.grad_accumulation_steps": 1,
    "train.early_stopping_patience": 0,
    "train.max_skipped_fraction": 1.0,
    "decode.checkpoint": "best",
}

# Sections whose every field has a rule above (other `task.*` fields belong to the data code).
_CLOSED_SECTIONS = ("train", "decode")


def _get(config: ml_collections.ConfigDict, path: str) -> Any:
  node = config
  for name in path.split("."):
    if name not in node:
      raise ValueError(f"config field {path} is missing.")
    node = node[name]
  return node


def _fill_defaults(config: ml_collections.ConfigDict) -> None:
  """Sets each missing field of `DEFAULTS` to its default, with a warning."""
  for path, value in DEFAULTS.items():
    section, name = path.split(".")
    if section in config and name not in config[section]:
      logging.warning("config field %s is missing (a config written before it existed): using "
                      "%r.", path, value)
      with config.unlocked():
        config[section][name] = value


def _check_rules(config: ml_collections.ConfigDict) -> None:
  for path, rule in RULES.items():
    value = _get(config, path)
    if not rule.check(value):
      raise ValueError(f"config field {path}={value!r} is invalid: must be {rule.allowed}.")
  for section in _CLOSED_SECTIONS:
    for name in config[section]:
      if f"{section}.{name}" not in RULES:
        known = ", ".join(p.split(".", 1)[1] for p in RULES if p.startswith(f"{section}."))
        raise ValueError(f"unknown config field {section}.{name}; {section} has: {known}.")


def _check_ranges(config: ml_collections.ConfigDict) -> None:
  """Checks between fields: ranges given as (min, max) and lengths against model.max_len."""
  synthetic = config.task.synthetic
  for low, high in (("min_words", "max_words"), ("long_min_words", "long_max_words")):
    if synthetic[low] > synthetic[high]:
      raise ValueError(f"config field task.synthetic.{low}={synthetic[low]} must be <= "
                       f"task.synthetic.{high}={synthetic[high]}.")
  for path in ("task.max_length", "decode.max_decode_len"):
    if _get(config, path) > config.model.max_len:
      raise ValueError(f"config field {path}={_get(config, path)} must be <= "
                       f"model.max_len={config.model.max_len}.")


def validate(config: ml_collections.ConfigDict) -> model_lib.TransformerConfig:
  """Validates every field of a run config.

  Args:
    config: the full config (seed, task, model, train, decode).

  Missing fields of `DEFAULTS` are set to their defaults first (a config.json written before
  they existed).

  Returns:
    The model config built from `config.model` and `config.task.vocab_size`.

  Raises:
    ValueError: naming the first invalid field, its value and the allowed values.
  """
  _fill_defaults(config)
  _check_rules(config)
  _check_ranges(config)
  return model_lib.TransformerConfig.from_config(config.model, config.task.vocab_size)
