"""Validation of a run's config, once at start, before any work.

Every field outside `model.*` has its `relpos.fields.Field` here (`FIELDS`); `model.*` fields
are those of `relpos.model.FIELDS` and of the position variants (`relpos.variants`), checked by
`relpos.model.TransformerConfig.from_config`. One system (`relpos.fields.resolve`) checks them
all: an invalid value raises a ValueError that names the field, the value and what is allowed;
a field with a default that a config lacks (a config.json written before the field existed)
takes the default, with a warning.
"""
import re
from typing import Any

import ml_collections

from relpos import fields
from relpos import model as model_lib
from relpos.fields import BOOLEAN, NON_EMPTY_STRING, REQUIRED, STRING, Field, integer, number
from relpos.fields import one_of

TASKS = ("synthetic", "multi30k", "wmt14")
# The checkpoint a table scores (and eval.py's named ones): the best by validation BLEU, the
# latest, or the average of the parameters of the last N saved ones (group 1: N).
CHECKPOINT_CHOICE = re.compile(r"best|latest|average:([2-9]|[1-9][0-9]+)")


# Field path -> Field, for every field outside `model.*`. The defaults are those of fields added
# after runs were saved: the value that reproduces those runs.
FIELDS: dict[str, Field] = {
    "seed": Field(REQUIRED, integer(0)),
    "task.name": Field(REQUIRED, one_of(*TASKS)),
    "task.tfds_data_dir": Field(REQUIRED, STRING),
    "task.source_lang": Field(REQUIRED, NON_EMPTY_STRING),
    "task.target_lang": Field(REQUIRED, NON_EMPTY_STRING),
    "task.manual_dir": Field(REQUIRED, STRING),
    "task.download_url": Field(REQUIRED, STRING),
    "task.vocab_size": Field(REQUIRED, integer(8)),
    "task.spm_model_type": Field(REQUIRED, one_of("unigram", "bpe", "word", "char")),
    "task.spm_seed": Field(REQUIRED, integer(0)),
    "task.max_length": Field(REQUIRED, integer(2)),
    "task.overlong": Field(REQUIRED, one_of("filter", "truncate")),
    "task.packing": Field(REQUIRED, BOOLEAN),
    "task.shuffle_buffer_seed": Field(REQUIRED, integer(0)),
    "task.concat_probability": Field(0.0, number(0.0, 1.0)),
    "task.synthetic.seed": Field(REQUIRED, integer(0)),
    "task.synthetic.num_train": Field(REQUIRED, integer(1)),
    "task.synthetic.num_validation": Field(REQUIRED, integer(1)),
    "task.synthetic.num_test": Field(REQUIRED, integer(1)),
    "task.synthetic.num_test_long": Field(REQUIRED, integer(1)),
    "task.synthetic.min_words": Field(REQUIRED, integer(1)),
    "task.synthetic.max_words": Field(REQUIRED, integer(1)),
    "task.synthetic.long_min_words": Field(REQUIRED, integer(1)),
    "task.synthetic.long_max_words": Field(REQUIRED, integer(1)),
    "train.batch_size": Field(REQUIRED, integer(1)),
    "train.grad_accumulation_steps": Field(1, integer(1)),
    "train.num_steps": Field(REQUIRED, integer(1)),
    "train.learning_rate": Field(REQUIRED, number(0.0, open_min=True)),
    "train.warmup_steps": Field(REQUIRED, integer(1)),
    "train.adam_b1": Field(REQUIRED, number(0.0, 1.0, open_max=True)),
    "train.adam_b2": Field(REQUIRED, number(0.0, 1.0, open_max=True)),
    "train.adam_eps": Field(REQUIRED, number(0.0, open_min=True)),
    "train.weight_decay": Field(REQUIRED, number(0.0)),
    "train.label_smoothing": Field(REQUIRED, number(0.0, 1.0, open_max=True)),
    "train.grad_clip_norm": Field(REQUIRED, number(0.0)),
    "train.nonfinite": Field(REQUIRED, one_of("raise", "skip")),
    "train.max_skipped_fraction": Field(1.0, number(0.0, 1.0)),
    "train.log_every_steps": Field(REQUIRED, integer(1)),
    "train.eval_every_steps": Field(REQUIRED, integer(1)),
    "train.early_stopping_patience": Field(0, integer(0)),
    "train.checkpoint_every_steps": Field(REQUIRED, integer(1)),
    "train.keep_checkpoints": Field(REQUIRED, integer(1)),
    "train.eval_batch_size": Field(REQUIRED, integer(1)),
    "decode.beam_size": Field(REQUIRED, integer(1)),
    "decode.alpha": Field(REQUIRED, number(0.0)),
    "decode.max_decode_len": Field(REQUIRED, integer(0)),
    "decode.validation_bleu": Field(REQUIRED, BOOLEAN),
    "decode.checkpoint": Field("best", fields.Rule(
        "'best', 'latest' or 'average:<N>' with N >= 2",
        lambda v: isinstance(v, str) and bool(CHECKPOINT_CHOICE.fullmatch(v)))),
    "decode.length_diagnostics": Field(True, BOOLEAN),
    "decode.other_checkpoints": Field("", fields.Rule(
        "'' or a comma-separated list of 'best', 'latest' and 'average:<N>' (N >= 2)",
        lambda v: isinstance(v, str) and all(
            CHECKPOINT_CHOICE.fullmatch(c) for c in v.split(",")) if v else v == "")),
}

# Fields that change neither what a run trains nor what it reports under decode.checkpoint:
# where data is read from, how often a run logs and checkpoints, how many checkpoints it keeps,
# which other checkpoints it scores besides, and whether it records the length diagnostics.
# A finished run is reused for a request that
# differs from it only here.
RESULT_NEUTRAL_FIELDS = ("task.tfds_data_dir", "task.manual_dir", "task.download_url",
                         "train.log_every_steps", "train.checkpoint_every_steps",
                         "train.keep_checkpoints", "decode.other_checkpoints",
                         "decode.length_diagnostics")


def other_checkpoints(config: ml_collections.ConfigDict) -> list[str]:
  """The checkpoint choices of `decode.other_checkpoints`, in order (empty when none)."""
  return [c for c in config.decode.other_checkpoints.split(",") if c]


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
  """A nested dict as {"dotted.path": leaf value}."""
  flat = {}
  for name, value in tree.items():
    if isinstance(value, dict):
      flat.update(flatten(value, f"{prefix}{name}."))
    else:
      flat[f"{prefix}{name}"] = value
  return flat


def result_differences(before: ml_collections.ConfigDict, after: ml_collections.ConfigDict
                       ) -> list[tuple[str, Any, Any]]:
  """(field, value before, value after) of every field outside RESULT_NEUTRAL_FIELDS that
  differs between two validated configs, in field order (lists and tuples compare alike)."""
  old, new = flatten(before.to_dict()), flatten(after.to_dict())
  plain = lambda v: list(v) if isinstance(v, tuple) else v
  return [(k, old.get(k), new.get(k)) for k in sorted(old.keys() | new.keys())
          if k not in RESULT_NEUTRAL_FIELDS and plain(old.get(k)) != plain(new.get(k))]

# Sections whose every field is in FIELDS (other `task.*` fields belong to the data code).
_CLOSED_SECTIONS = ("train", "decode")


def _node(config: ml_collections.ConfigDict, path: str) -> Any:
  """The section or field at a dotted path ("" is the whole config)."""
  node = config
  for name in path.split(".") if path else ():
    if name not in node:
      raise ValueError(f"config field {path} is missing.")
    node = node[name]
  return node


def _set_missing(config: ml_collections.ConfigDict, node: ml_collections.ConfigDict,
                 values: dict[str, Any]) -> None:
  """Adds to `node`, a section of `config`, the fields of `values` it lacks (their defaults)."""
  with config.unlocked():
    node.update({name: value for name, value in values.items() if name not in node})


def _resolve_sections(config: ml_collections.ConfigDict) -> None:
  """Checks every field of FIELDS, section by section, setting missing ones to their defaults.

  In a closed section a field without an entry in FIELDS is an error; elsewhere it belongs to
  code that checks it itself.
  """
  sections = dict.fromkeys(path.rpartition(".")[0] for path in FIELDS)
  for section in sections:
    known = {path.rpartition(".")[2]: field for path, field in FIELDS.items()
             if path.rpartition(".")[0] == section}
    node = _node(config, section)
    given = {name: node[name] for name in node.keys()
             if section in _CLOSED_SECTIONS or name in known}
    _set_missing(config, node, fields.resolve(given, known, section))


def _check_ranges(config: ml_collections.ConfigDict) -> None:
  """Checks between fields: ranges given as (min, max) and lengths against model.max_len."""
  synthetic = config.task.synthetic
  for low, high in (("min_words", "max_words"), ("long_min_words", "long_max_words")):
    if synthetic[low] > synthetic[high]:
      raise ValueError(f"config field task.synthetic.{low}={synthetic[low]} must be <= "
                       f"task.synthetic.{high}={synthetic[high]}.")
  for path in ("task.max_length", "decode.max_decode_len"):
    if _node(config, path) > config.model.max_len:
      raise ValueError(f"config field {path}={_node(config, path)} must be <= "
                       f"model.max_len={config.model.max_len}.")


def default(path: str) -> Any:
  """The default of the config field at a dotted path (`fields.REQUIRED` when it has none, or
  when no registered field has that path)."""
  section, _, name = path.partition(".")
  field = model_lib.all_fields().get(name) if section == "model" else FIELDS.get(path)
  return fields.REQUIRED if field is None else field.default


def validate(config: ml_collections.ConfigDict) -> model_lib.TransformerConfig:
  """Validates every field of a run config.

  Args:
    config: the full config (seed, task, model, train, decode).

  Missing fields that have a default are set to it, in `config` too (a config.json written
  before they existed).

  Returns:
    The model config built from `config.model` and `config.task.vocab_size`.

  Raises:
    ValueError: naming the first invalid field, its value and the allowed values.
  """
  _resolve_sections(config)
  _check_ranges(config)
  model_config = model_lib.TransformerConfig.from_config(config.model, config.task.vocab_size)
  _set_missing(config, config.model, model_config.fields())
  return model_config
