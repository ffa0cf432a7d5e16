"""A run's config: its fields, its validation, how two configs differ, and its file.

A config has five sections. The fields of `seed`, `task.*`, `train.*` and `decode.*` are
declared below, one `relpos.fields.Field` each (default, rule, doc); `model.*` are the typed
attributes of `relpos.model_config.TransformerConfig` and the fields of the position variant it
selects. `validate` checks a config once, at a program's start, and returns a `RunConfig`: every
field present and checked, frozen; nothing downstream validates again. A run writes it to
`<workdir>/config.json` (`write_to`); `load` reads it back (for evaluation, resuming, a table).
Which fields two configs disagree on, and what each change does: `relpos.config_changes`.
"""
import dataclasses
import os
import re
from collections.abc import Mapping
from typing import Any

import jax
import ml_collections
from absl import logging

from relpos import checkpoint_schedule
from relpos import fields
from relpos import model_config
from relpos import json_files
from relpos import user_modules
from relpos import variant_trial
from relpos import workdir_files
from relpos.fields import BOOLEAN, NEUTRAL, NON_EMPTY_STRING, STRING, TOKENIZER, Field
from relpos.fields import integer, number, one_of

TASKS = ("synthetic", "multi30k", "wmt14")
# The checkpoint a table scores (and eval.py's named ones): the best by validation BLEU, the
# latest, or the average of the parameters of the last N saved ones (group 1: N).
CHECKPOINT_CHOICE = re.compile(r"best|latest|average:([2-9]|[1-9][0-9]+)")
_CHOICE = "'best', 'latest' or 'average:<N>' with N >= 2"

# Section -> field -> Field, for every section but `model`. The defaults are the synthetic
# task's with a model sized for 2 CPU cores (`configs/default.py`); `absent` is the value that
# reproduces runs saved before a field existed.
SECTIONS: dict[str, dict[str, Field]] = {
    "": {"seed": Field(0, integer(0), "parameters, dropout and data order", effect=fields.DATA)},
    "task": {
        "name": Field("synthetic", one_of(*TASKS), "the data", effect=TOKENIZER),
        "tfds_data_dir": Field("", STRING, "'' -> $RELPOS_DATA_DIR or ~/tensorflow_datasets",
                               effect=NEUTRAL),
        "source_lang": Field("en", NON_EMPTY_STRING, "source language", effect=TOKENIZER),
        "target_lang": Field("de", NON_EMPTY_STRING, "target language", effect=TOKENIZER),
        "manual_dir": Field(
            "", STRING, "multi30k: the folder of its raw .gz files (read once, "
            "into tfds_data_dir)", effect=NEUTRAL),
        "download_url": Field("", STRING, "multi30k: URL base of downloads ('' -> public repo)",
                              effect=NEUTRAL),
        "vocab_size": Field(256, integer(8), "SentencePiece vocabulary (source and target)",
                            effect=TOKENIZER),
        "spm_model_type": Field("unigram", one_of("unigram", "bpe", "word", "char"),
                                "SentencePiece model", effect=TOKENIZER),
        "spm_seed": Field(0, integer(0), "tokenizer training sample (above 2M sentences)",
                          effect=TOKENIZER),
        "max_length": Field(48, integer(2), "training: tokens per sequence", effect=fields.DATA),
        "overlong": Field("filter", one_of("filter", "truncate"),
                          "training sentences over max_length (evaluation never drops)",
                          effect=fields.DATA),
        "packing": Field(True, BOOLEAN, "pack examples into rows (False: length buckets)",
                         effect=fields.DATA),
        "shuffle_buffer_seed": Field(0, integer(0), "folded with seed into the shuffle seed",
                                     effect=fields.DATA),
        "concat_probability": Field(
            0.0, number(0.0, 1.0), "training: probability that an example is joined with a "
            "random other one (Kondo et al. 2021); 0: off"),
    },
    "task.synthetic": {
        "seed": Field(1234, integer(0), "the generated corpus", effect=TOKENIZER),
        "num_train": Field(20000, integer(1), "training pairs", effect=TOKENIZER),
        "num_validation": Field(500, integer(1), "validation pairs"),
        "num_test": Field(500, integer(1), "test pairs"),
        "num_test_long": Field(500, integer(1), "test_long pairs"),
        "num_test_long_seen": Field(
            0, integer(0), "test_long_seen pairs: test_long's lengths, constructions seen in "
            "training only (length alone); 0: no such split", effect=fields.EXTRA_SPLIT),
        "min_words": Field(3, integer(1), "train/validation/test source length range (words)",
                           effect=TOKENIZER),
        "max_words": Field(12, integer(1), "", effect=TOKENIZER),
        "long_min_words": Field(13, integer(1), "test_long source length range (words)"),
        "long_max_words": Field(24, integer(1), ""),
    },
    "train": {
        "batch_size": Field(32, integer(1), "global, rows of task.max_length tokens"),
        "grad_accumulation_steps": Field(
            1, integer(1), "micro-batches of batch_size / N rows a step (batch_size divides by "
            "N times the device count)"),
        "num_steps": Field(1000, integer(1), "training steps"),
        "learning_rate": Field(0.002, number(0.0, open_min=True), "peak, after warmup_steps"),
        "warmup_steps": Field(150, integer(1), "linear warm-up, then inverse square root"),
        "adam_b1": Field(0.9, number(0.0, 1.0, open_max=True), "Adam beta1"),
        "adam_b2": Field(0.98, number(0.0, 1.0, open_max=True), "Adam beta2"),
        "adam_eps": Field(1e-9, number(0.0, open_min=True), "Adam epsilon"),
        "weight_decay": Field(0.0, number(0.0), "decoupled weight decay (AdamW)"),
        "label_smoothing": Field(0.1, number(0.0, 1.0, open_max=True), "of the loss"),
        "grad_clip_norm": Field(0.0, number(0.0), "global gradient norm clip; 0: none"),
        "nonfinite": Field("raise", one_of("raise", "skip"),
                           "a non-finite loss or update: stop, or skip the step"),
        "max_skipped_fraction": Field(0.01, number(0.0, 1.0), "skip: stop once more of "
                                      "num_steps' updates were skipped", absent=1.0),
        "log_every_steps": Field(50, integer(1), "train metrics", effect=NEUTRAL),
        "eval_every_steps": Field(500, integer(1), "validation (and a checkpoint)"),
        "early_stopping_patience": Field(
            0, integer(0), "stop after this many validations without a better BLEU (loss "
            "without BLEU); 0: train num_steps"),
        "checkpoint_every_steps": Field(500, integer(1), "checkpoints", effect=NEUTRAL),
        "keep_checkpoints": Field(2, integer(1), "the newest kept (and the best)", effect=NEUTRAL),
        "eval_batch_size": Field(64, integer(1), "rows of an evaluation batch"),
    },
    "decode": {
        "beam_size": Field(4, integer(1), "beam search width (1: greedy)"),
        "alpha": Field(0.6, number(0.0), "GNMT length penalty"),
        "max_decode_len": Field(0, integer(0), "0 -> 2 * source length + 10, <= model.max_len"),
        "validation_bleu": Field(
            True, BOOLEAN, "beam-search BLEU at each validation (else "
            "checkpoints and early stopping rank by loss)", effect=fields.SELECTION),
        "checkpoint": Field(
            "best",
            fields.Rule(_CHOICE,
                        lambda v: isinstance(v, str) and bool(CHECKPOINT_CHOICE.fullmatch(v))),
            "the checkpoint a table scores: best (validation BLEU) | latest | average:<N> "
            "(the parameters of the last N saved on schedule averaged)"),
        "other_checkpoints": Field(
            "",
            fields.Rule(
                f"'' or a comma-separated list of {_CHOICE}", lambda v: isinstance(v, str) and all(
                    CHECKPOINT_CHOICE.fullmatch(c) for c in v.split(",")) if v else v == ""),
            "choices a table scores beside `checkpoint`, e.g. 'average:10,latest'", effect=NEUTRAL),
        "length_diagnostics": Field(
            True, BOOLEAN, "a table run's length diagnostics "
            "(relpos.experiments.diagnostics)", effect=NEUTRAL),
    },
}
MODEL = "model"


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """A validated run config: every field present and checked.

  Attributes:
    seed: the run's seed.
    task, train, decode: their sections (read-only ConfigDicts: `config.train.batch_size`).
    model: the architecture, typed.
  """
  seed: int
  task: ml_collections.FrozenConfigDict
  model: model_config.TransformerConfig
  train: ml_collections.FrozenConfigDict
  decode: ml_collections.FrozenConfigDict

  def to_dict(self) -> dict[str, Any]:
    """The config as nested plain data, as config.json and results.json hold it."""
    return {
        "seed": self.seed, "task": self.task.to_dict(), "model": self.model.to_dict(),
        "train": self.train.to_dict(), "decode": self.decode.to_dict()
    }

  def other_checkpoints(self) -> list[str]:
    """The checkpoint choices of `decode.other_checkpoints`, in order (empty when none)."""
    return [c for c in self.decode.other_checkpoints.split(",") if c]


def default_config() -> ml_collections.ConfigDict:
  """A config with every field at its default (every registered variant's `model.*` fields
  too, so that the command line can set them)."""
  config = {}
  for section, declared in SECTIONS.items():
    node = config
    for name in section.split(".") if section else ():
      node = node.setdefault(name, {})
    node.update({name: field.default for name, field in declared.items()})
  config[MODEL] = model_config.default_config().to_dict()
  ordered = {name: config[name] for name in ("seed", "task", MODEL, "train", "decode")}
  return ml_collections.ConfigDict(ordered)


def _sections(given: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
  """The checked fields of every section but `model`, by section (`SECTIONS`' order)."""
  resolved = {}
  for section, declared in SECTIONS.items():
    node = given
    for name in section.split(".") if section else ():
      node = node.get(name) if isinstance(node, Mapping) else None
      if not isinstance(node, Mapping):
        raise ValueError(f"config section {section} is missing.")
    subsections = {
        path.rpartition(".")[2] for path in SECTIONS if path and path.rpartition(".")[0] == section
    }
    if not section:
      subsections |= {MODEL}
    values = {name: value for name, value in node.items() if name not in subsections}
    resolved[section] = fields.resolve(values, declared, section)
  return resolved


def averaged_count(choice: str) -> int:
  """N of a checkpoint choice "average:N"; 0 for any other ("best", "latest")."""
  chosen = CHECKPOINT_CHOICE.fullmatch(choice)
  return int(chosen[1]) if chosen and chosen[1] else 0


# The fields of `task` (and section task.synthetic) that only some tasks read; the synthetic
# task's languages are fixed (an English-like source, an invented target scored with Moses's
# "de" rules). Given another value under another task they would change nothing.
_READ_ONLY_BY = {
    "source_lang": ("multi30k", "wmt14"),
    "target_lang": ("multi30k", "wmt14"),
    "manual_dir": ("multi30k",),
    "download_url": ("multi30k",),
    **{f"synthetic.{name}": ("synthetic",) for name in SECTIONS["task.synthetic"]},
}


def _check_task_fields(sections: dict[str, dict[str, Any]]) -> None:
  """Refuses a task field set away from its default under a task that does not read it."""
  task = sections["task"]["name"]
  for name, readers in _READ_ONLY_BY.items():
    section, _, field = f"task.{name}".rpartition(".")
    value, default = sections[section][field], SECTIONS[section][field].default
    if task not in readers and value != default:
      raise ValueError(f"config field task.{name}={value!r} changes nothing under "
                       f"task.name={task!r} (read by {' and '.join(readers)} only); leave "
                       f"it at {default!r}.")


def _check_between(sections: dict[str, dict[str, Any]],
                   model: model_config.TransformerConfig) -> None:
  """Rules between fields: ranges given as (min, max), lengths against model.max_len, an
  average of checkpoints against how many are kept and saved, task fields the task reads."""
  _check_task_fields(sections)
  synthetic = sections["task.synthetic"]
  for low, high in (("min_words", "max_words"), ("long_min_words", "long_max_words")):
    if synthetic[low] > synthetic[high]:
      raise ValueError(f"config field task.synthetic.{low}={synthetic[low]} must be <= "
                       f"task.synthetic.{high}={synthetic[high]}.")
  for section, name in (("task", "max_length"), ("decode", "max_decode_len")):
    if sections[section][name] > model.max_len:
      raise ValueError(f"config field {section}.{name}={sections[section][name]} must be <= "
                       f"model.max_len={model.max_len}.")
  decode, train = sections["decode"], sections["train"]
  keep = train["keep_checkpoints"]
  saved = checkpoint_schedule.count_on_schedule(ml_collections.ConfigDict(train))
  for name, choices in (("checkpoint", decode["checkpoint"]), ("other_checkpoints",
                                                               decode["other_checkpoints"])):
    for choice in choices.split(","):
      if averaged_count(choice) > keep:
        raise ValueError(f"config field decode.{name}={choices!r} averages more checkpoints "
                         f"than train.keep_checkpoints={keep} keeps.")
      if averaged_count(choice) > saved:
        raise ValueError(
            f"config field decode.{name}={choices!r} averages more checkpoints than the "
            f"{saved} a run saves on schedule (train.num_steps={train['num_steps']}, "
            f"train.checkpoint_every_steps={train['checkpoint_every_steps']}, "
            f"train.eval_every_steps={train['eval_every_steps']}).")


def validate(config: ml_collections.ConfigDict | Mapping[str, Any]) -> RunConfig:
  """Checks every field of a run config; the one validation of a program.

  Args:
    config: the full config (seed, task, model, train, decode); left as it is.

  Returns:
    The validated config. A field the config lacks takes its value for configs saved before
    it existed, with a warning.

  Raises:
    ValueError: naming the first invalid, unknown or missing field, its value and what is
      allowed.
  """
  given = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else dict(config)
  sections = _sections(given)
  if not isinstance(given.get(MODEL), Mapping):
    raise ValueError("config section model is missing.")
  model = model_config.TransformerConfig.from_config(given[MODEL], sections["task"]["vocab_size"])
  _check_between(sections, model)
  variant_trial.check_variant(model)
  task = {**sections["task"], "synthetic": sections["task.synthetic"]}
  return RunConfig(seed=sections[""]["seed"], task=ml_collections.FrozenConfigDict(task),
                   model=model, train=ml_collections.FrozenConfigDict(sections["train"]),
                   decode=ml_collections.FrozenConfigDict(sections["decode"]))


def set_fields(config: ml_collections.ConfigDict, dotted: Mapping[str, Any]) -> None:
  """Sets dotted fields of `config` in place, e.g. {"task.concat_probability": 0.5}.

  Raises:
    ValueError: for a field the config lacks, or a value of another type than the field's.
  """
  def check_has(section: Any, part: str, name: str, prefix: str) -> None:
    if not isinstance(section, ml_collections.ConfigDict):  # `seed.x`: a value has no fields
      raise ValueError(f"override {name!r}: {prefix} is a value, not a section of fields.")
    if part not in section:
      close = fields.close_names(part, list(section))
      raise ValueError(f"override {name!r}: no config field {part!r}."
                       f"{fields.did_you_mean(close, name, list(section))}")

  for name, value in dotted.items():
    parent = config
    *path, leaf = name.split(".")
    for depth, part in enumerate(path):
      check_has(parent, part, name, ".".join(path[:depth]))
      parent = parent[part]
    check_has(parent, leaf, name, ".".join(path))
    wrong_type = ValueError(f"override {name}={value!r}: the field holds "
                            f"{type(parent[leaf]).__name__} values, e.g. {parent[leaf]!r}.")
    if isinstance(value, bool) and not isinstance(parent[leaf], (bool, type(None))):
      raise wrong_type  # ConfigDict would store True as 1.0 in a float field
    try:
      parent[leaf] = value
    except TypeError:  # ConfigDict refuses a value of another type
      raise wrong_type from None


def replace(config: RunConfig, values: Mapping[str, Any]) -> RunConfig:
  """`config` with the fields at dotted paths set (`set_fields`, e.g. {"decode.beam_size": 5}),
  validated."""
  data = ml_collections.ConfigDict(config.to_dict())
  set_fields(data, values)
  return validate(data)


# --- a run's file --------------------------------------------------------------------------


def read(path: str) -> RunConfig:
  """The validated config in a config.json (data: nothing in it is executed or unpickled).

  A variant of the user's own must be registered first (`load` imports the run's modules). A
  run trained with model.attention_implementation='cudnn' is read on a machine where cuDNN
  cannot run (evaluated, or resumed, on a CPU) as 'auto', which computes the same function,
  with a warning.

  Raises:
    ValueError: naming the file, when it is not JSON, not a config or not a valid one.
  """
  data = json_files.read_json(path)
  try:
    data = ml_collections.ConfigDict(data)  # refuses what is no config (e.g. "__reduce__")
  except (AttributeError, TypeError, ValueError) as e:
    raise ValueError(f"{path} does not hold a config: {e}") from None
  try:
    return validate(data)
  except ValueError as e:
    error = e
  if data.get("model", {}).get("attention_implementation") == "cudnn":
    data.model.attention_implementation = "auto"
    try:
      config = validate(data)
    except ValueError:
      pass
    else:
      logging.warning(
          "%s: the run was trained with cuDNN attention, which cannot run here (%s); "
          "it is read with model.attention_implementation='auto', which computes the "
          "same function.", path, error)
      return config
  raise ValueError(f"{path}: {error}") from None


def load(workdir: str) -> RunConfig:
  """The config a run wrote (`workdir/config.json`), after importing the modules the run
  imported (`workdir/imports.json`: its own position variant).

  Raises:
    FileNotFoundError: the workdir or its config.json does not exist.
    ValueError: the config is not JSON, not a config, or invalid (naming the file); a recorded
      module fails to import or lies inside the workdir.
  """
  if not os.path.isdir(workdir):
    raise FileNotFoundError(f"workdir {workdir} does not exist.")
  path = os.path.join(workdir, workdir_files.CONFIG_FILE)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} does not exist: {workdir} is not a training workdir.")
  user_modules.import_recorded(workdir)
  return read(path)


def write_to(config: RunConfig, workdir: str) -> None:
  """Writes what rebuilds the run's model (process 0): `workdir/imports.json`, the modules of
  the user's own that define its position variant (`user_modules.write_imports`; none for a
  variant of relpos), and `workdir/config.json`, whole or not at all (a temporary file renamed),
  so that evaluation never reads half of it."""
  user_modules.write_imports(workdir, config.model.position)
  if jax.process_index() == 0:
    json_files.write_json(os.path.join(workdir, workdir_files.CONFIG_FILE), config.to_dict(),
                          indent=2, sort_keys=True)
