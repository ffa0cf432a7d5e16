"""What changing a config field does: the fields two configs differ in (`differences`), those
that change a run's result (`result_differences`: a table reuses a finished run only without
any), and those a resume may not change (`check_resume`), each by its field's `effect`
(`relpos.fields`)."""
import os
from collections.abc import Mapping
from typing import Any

from absl import logging

from relpos import fields
from relpos import model_config
from relpos import run_config
from relpos import workdir_files


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  """A nested mapping as {"dotted.path": leaf value}."""
  flat = {}
  for name, value in tree.items():
    if isinstance(value, Mapping):
      flat.update(flatten(value, f"{prefix}{name}."))
    else:
      flat[f"{prefix}{name}"] = value
  return flat


def effect(path: str) -> str:
  """What changing the field at a dotted path does (`relpos.fields` fields.NEUTRAL, RESULT,
  fields.TOKENIZER, PARAMETERS, SELECTION or DATA)."""
  section, _, name = path.rpartition(".")
  if section == run_config.MODEL:
    field = {**model_config.FIELDS, **model_config.variant_fields()}.get(name)
    default = fields.PARAMETERS
  else:
    field = run_config.SECTIONS.get(section, {}).get(name)
    default = fields.RESULT
  return default if field is None or field.effect is None else field.effect


def differences(before: run_config.RunConfig,
                after: run_config.RunConfig) -> list[tuple[str, Any, Any]]:
  """(field, value before, value after) of every field that differs, in path order (lists and
  tuples compare alike). Under two position variants, only model.position and the fields both
  have are compared."""
  old, new = flatten(before.to_dict()), flatten(after.to_dict())
  if before.model.position != after.model.position:  # their variants' fields don't compare
    old = {k: v for k, v in old.items() if k in new or not k.startswith(f"{run_config.MODEL}.")}
    new = {k: v for k, v in new.items() if k in old or not k.startswith(f"{run_config.MODEL}.")}
  plain = lambda v: list(v) if isinstance(v, tuple) else v
  return [(k, old.get(k), new.get(k))
          for k in sorted(old.keys() | new.keys())
          if plain(old.get(k)) != plain(new.get(k))]


def _averages(config: run_config.RunConfig) -> bool:
  """Whether a table scores an `average:N` of the run's checkpoints (decode.checkpoint or
  decode.other_checkpoints)."""
  choices = [config.decode.checkpoint, *config.decode.other_checkpoints.split(",")]
  return any(run_config.averaged_count(c) for c in choices)


def result_differences(before: run_config.RunConfig,
                       after: run_config.RunConfig) -> list[tuple[str, Any, Any]]:
  """`differences` that change a run's result: a finished run is reused only without any.
  train.checkpoint_every_steps counts where a table scores an `average:N`, whose checkpoints
  it sets; an EXTRA_SPLIT field only from one size to another (turning the split on or off
  changes no other result)."""
  averaged = _averages(before) or _averages(after)
  extra_split_toggled = lambda d: effect(d[0]) == fields.EXTRA_SPLIT and 0 in (d[1], d[2])
  return [
      d for d in differences(before, after)
      if (effect(d[0]) != fields.NEUTRAL and not extra_split_toggled(d)) or
      (averaged and d[0] == "train.checkpoint_every_steps")
  ]


# Why a change stops a resume: by the field's effect, or by what `_resume_effect` finds.
VALIDATION_MEASURE, OPTIMIZER_FORM = "validation measure", "optimizer form"
_FIXED_ON_RESUME = {
    fields.TOKENIZER: "the tokenizer would change under the model",
    fields.PARAMETERS: "the model would change under its parameters",
    fields.SELECTION: ("the best checkpoint and early stopping would rank validation BLEU "
                       "against validation loss"),
    fields.DATA: ("the data position saved with the checkpoints would mean another place in the "
                  "data"),
    VALIDATION_MEASURE: ("the best checkpoint and early stopping would rank validations measured "
                         "two ways"),
    OPTIMIZER_FORM: ("the optimizer would gain or lose a transform, and the optimizer state "
                     "saved with the checkpoints would not fit it"),
}
# The decoding of validation BLEU (when decode.validation_bleu ranks checkpoints by it) and the
# validation set: a change ranks new validations against old ones.
_VALIDATION_FIELDS = ("decode.beam_size", "decode.alpha", "decode.max_decode_len")
# Transforms `train_state.make_optimizer` adds only above 0.
_OPTIONAL_TRANSFORMS = ("train.grad_clip_norm", "train.weight_decay")


def _resume_effect(change: tuple[str, Any, Any], config: run_config.RunConfig) -> str:
  """`effect` of a changed (field, before, after), or what else makes it stop a resume: without
  packing a saved position counts windows of train.batch_size examples (DATA); validation
  decoding under decode.validation_bleu, and the synthetic task's validation set, change how
  validations are measured (VALIDATION_MEASURE); clipping or weight decay turned on or off
  changes the optimizer state's form (OPTIMIZER_FORM)."""
  path, before, after = change
  if path == "train.batch_size" and not config.task.packing:
    return fields.DATA
  if (path in _VALIDATION_FIELDS and config.decode.validation_bleu or
      path == "task.synthetic.num_validation" and config.task.name == "synthetic"):
    return VALIDATION_MEASURE
  if path in _OPTIONAL_TRANSFORMS and ((before or 0) > 0) != ((after or 0) > 0):
    return OPTIMIZER_FORM
  return effect(path)


def check_resume(config: run_config.RunConfig, workdir: str, *,
                 resuming: bool) -> list[tuple[str, Any, Any]]:
  """Compares `config` with the config.json of the run's earlier start (when there is one),
  warning about the fields that differ.

  Returns:
    The (field, value before, value now) that differ (`differences`; none without config.json),
    for the start's record (`metrics_writer.record_start`): config.json names only the last.

  Raises:
    ValueError: (`resuming`) a field that would change the tokenizer or the model under the
      checkpoints' parameters, the ranking of checkpoints or how validations are measured, the
      optimizer state's form, or the meaning of the saved data position changed, naming it,
      both values, the file and what to do; the file is not a valid config (named); or
      (`resuming`) it is missing: what the checkpoints were trained with is then unknown.
  """
  path = os.path.join(workdir, workdir_files.CONFIG_FILE)
  if not os.path.exists(path):
    if resuming:  # written before the first checkpoint: deleted, or a partial copy
      raise ValueError(
          f"{path} is missing, but {workdir} holds checkpoints: the config they were trained "
          "with is unknown, so a changed field would go unnoticed. Put the run's config.json "
          "back, or train in a new --workdir.")
    return []
  changed = differences(run_config.read(path), config)
  fixed = [d for d in changed if _resume_effect(d, config) in _FIXED_ON_RESUME]
  if resuming and fixed:
    field, before, after = fixed[0]
    why = _FIXED_ON_RESUME[_resume_effect(fixed[0], config)]
    raise ValueError(
        f"config field {field}={after!r} differs from the {before!r} that the checkpoints in "
        f"{workdir} were trained with ({path}): {why}. Resume "
        f"with {field}={before!r} or train in a new --workdir.")
  if changed:
    logging.warning("%s: changed since the run's last start: %s.", path,
                    ", ".join(f"{k}={b!r}->{a!r}" for k, b, a in changed))
  return changed
