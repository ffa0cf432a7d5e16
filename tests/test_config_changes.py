"""Tests for relpos.config_changes: which changed fields stop a resume (the model, the
tokenizer, the ranking of checkpoints, the data position), and which change a result."""
import re

import pytest

from configs import tiny
from relpos import config_changes
from relpos import run_config
from test_run_config import _saved_run


def _set(config, path: str, value):
  """Sets the field at a dotted path ("seed", "task.synthetic.num_validation") and returns the
  value it had."""
  *sections, name = path.split(".")
  for section in sections:
    config = config[section]
  before, config[name] = config[name], value
  return before


@pytest.mark.parametrize("field, value", [("model.position", "rope"), ("model.dtype", "bfloat16"),
                                          ("model.dropout_rate", 0.3),
                                          ("model.max_relative_position", 8)])
def test_a_model_field_changed_on_resume_stops(tmp_path, field, value):
  workdir, saved = _saved_run(tmp_path)
  config = tiny.get_config()
  if field == "model.position":  # the other variant's fields at their defaults
    config.model.max_relative_position = 16
  config.model[field.split(".")[1]] = value
  config = run_config.validate(config)
  config_changes.check_resume(config, workdir, resuming=False)  # nothing saved: a warning
  before = saved["model"][field.split(".")[1]]
  with pytest.raises(
      ValueError, match=(
          rf"^config field {field}={value!r} differs from the {before!r} that the checkpoints in "
          rf"{workdir} were trained with \({workdir}/config.json\): the model would change under "
          rf"its parameters. Resume with {field}={before!r} or train in a new --workdir.$")):
    config_changes.check_resume(config, workdir, resuming=True)


def test_validation_bleu_changed_on_resume_stops(tmp_path):
  """Checkpoints and early stopping rank by validation BLEU, or by loss without it: one history
  with both would rank a BLEU of 20 above every loss."""
  workdir, _ = _saved_run(tmp_path)
  config = tiny.get_config()
  config.decode.validation_bleu = False
  with pytest.raises(
      ValueError, match=re.escape(
          "config field decode.validation_bleu=False differs from the True that the checkpoints "
          f"in {workdir} were trained with ({workdir}/config.json): the best checkpoint and early "
          "stopping would rank validation BLEU against validation loss. Resume with "
          "decode.validation_bleu=True or train in a new --workdir.")):
    config_changes.check_resume(run_config.validate(config), workdir, resuming=True)


def test_a_change_of_the_generated_corpus_stops_a_resume_naming_it(tmp_path):
  """The synthetic corpus is the tokenizer's training text: its seed changes the tokenizer."""
  workdir, _ = _saved_run(tmp_path)
  config = tiny.get_config()
  config.task.synthetic.seed += 1
  with pytest.raises(
      ValueError, match=r"^config field task.synthetic.seed=.*the tokenizer would "
      r"change under the model"):
    config_changes.check_resume(run_config.validate(config), workdir, resuming=True)


def test_resume_allows_the_kernel_and_training_dynamics_to_change(tmp_path, caplog):
  workdir, _ = _saved_run(tmp_path)
  config = tiny.get_config()
  config.model.attention_implementation = "xla"
  config.train.update(learning_rate=0.001, num_steps=40)
  config_changes.check_resume(run_config.validate(config), workdir, resuming=True)
  assert "model.attention_implementation='auto'->'xla'" in caplog.text
  assert "train.learning_rate=0.002->0.001" in caplog.text


def test_a_field_newer_than_the_saved_config_stops_a_resume_only_off_its_default(tmp_path, caplog):
  """A campaign resumed across commits: a field the old config.json lacks was its default."""
  workdir, _ = _saved_run(tmp_path,
                          lambda saved: saved["model"].pop("relative_shared_across_layers"))
  config = tiny.get_config()
  config_changes.check_resume(run_config.validate(config), workdir, resuming=True)
  assert "changed since the run's last start" not in caplog.text
  config.model.relative_shared_across_layers = True
  with pytest.raises(ValueError, match=r"model.relative_shared_across_layers=True differs from "
                     r"the False "):
    config_changes.check_resume(run_config.validate(config), workdir, resuming=True)


@pytest.mark.parametrize("packing, field, value", [(True, "task.packing", False),
                                                   (False, "task.packing", True),
                                                   (False, "train.batch_size", 64),
                                                   (True, "seed", 2),
                                                   (True, "task.shuffle_buffer_seed", 1),
                                                   (True, "task.max_length", 40),
                                                   (True, "task.overlong", "truncate")])
def test_a_change_of_the_data_position_meaning_stops_a_resume(tmp_path, packing, field, value):
  """A saved data position is of the pipeline's form (packed or bucketed), without packing it
  counts windows of batch_size examples, and it is an index into the seed's shuffle of the
  examples max_length keeps: a resume would fail in grain, or silently read other data (a seed
  changed on resume once only warned, and config.json then named the new seed)."""
  workdir, _ = _saved_run(tmp_path, lambda saved: saved["task"].update(packing=packing))
  config = tiny.get_config()
  config.task.packing = packing
  before = _set(config, field, value)
  with pytest.raises(
      ValueError, match=re.escape(
          f"config field {field}={value!r} differs from the {before!r} that the checkpoints in "
          f"{workdir} were trained with ({workdir}/config.json): the data position saved with the "
          "checkpoints would mean another place in the data.")):
    config_changes.check_resume(run_config.validate(config), workdir, resuming=True)


def test_packed_runs_may_resume_with_another_batch_size(tmp_path, caplog):
  workdir, _ = _saved_run(tmp_path)
  config = tiny.get_config()
  config.train.batch_size *= 2
  config_changes.check_resume(run_config.validate(config), workdir, resuming=True)
  assert "train.batch_size=" in caplog.text


def test_the_checkpoint_interval_changes_a_result_only_where_checkpoints_are_averaged():
  """average:10 of checkpoints every 100 steps is another model than of every 500: a finished
  run is not reused across it; without an average the interval changes nothing scored."""
  before, after = tiny.get_config(), tiny.get_config()
  after.train.checkpoint_every_steps = before.train.checkpoint_every_steps + 1
  assert config_changes.result_differences(run_config.validate(before),
                                           run_config.validate(after)) == []
  for config in (before, after):
    config.decode.other_checkpoints = "latest,average:2"
    config.train.keep_checkpoints = 2
  assert [
      d[0] for d in config_changes.result_differences(run_config.validate(before),
                                                      run_config.validate(after))
  ] == ["train.checkpoint_every_steps"]


def test_an_extra_split_turned_on_or_off_changes_no_other_result(tmp_path):
  """A run without test_long_seen is reused by a table that scores it (the split missing from
  its result) and resumes into it; another size of the split is another result."""
  sizes = lambda before, after: config_changes.result_differences(
      run_config.validate(_with_seen(before)), run_config.validate(_with_seen(after)))
  assert sizes(0, 500) == sizes(500, 0) == []
  assert sizes(500, 1000) == [("task.synthetic.num_test_long_seen", 500, 1000)]
  workdir, _ = _saved_run(tmp_path)  # without the split
  assert config_changes.check_resume(run_config.validate(_with_seen(500)), workdir,
                                     resuming=True) == [("task.synthetic.num_test_long_seen", 0,
                                                         500)]  # recorded, not refused


def _with_seen(size: int):
  config = tiny.get_config()
  config.task.synthetic.num_test_long_seen = size
  return config


@pytest.mark.parametrize("field, value, why", [
    ("decode.beam_size", 1, "the best checkpoint and early stopping would rank validations "
     "measured two ways"),
    ("decode.alpha", 1.0, "the best checkpoint and early stopping would rank validations "
     "measured two ways"),
    ("decode.max_decode_len", 20, "the best checkpoint and early stopping would rank "
     "validations measured two ways"),
    ("task.synthetic.num_validation", 32, "the best checkpoint and early stopping would rank "
     "validations measured two ways"),
    ("train.grad_clip_norm", 1.0, "the optimizer would gain or lose a transform, and the "
     "optimizer state saved with the checkpoints would not fit it"),
    ("train.weight_decay", 0.01, "the optimizer would gain or lose a transform, and the "
     "optimizer state saved with the checkpoints would not fit it"),
])
def test_what_checkpoints_are_ranked_by_or_the_optimizer_form_stops_a_resume(
    tmp_path, field, value, why):
  """Validation BLEU decoded otherwise (or on another validation set) would be ranked against
  the earlier validations; clipping or weight decay turned on would give the optimizer state a
  form the checkpoints do not have (Orbax's mismatch read as damage before)."""
  workdir, _ = _saved_run(tmp_path)
  config = tiny.get_config()
  before = _set(config, field, value)
  with pytest.raises(
      ValueError, match=re.escape(f"config field {field}={value!r} differs from the "
                                  f"{before!r} that the checkpoints in {workdir} were "
                                  f"trained with ({workdir}/config.json): {why}. Resume")):
    config_changes.check_resume(run_config.validate(config), workdir, resuming=True)


def test_weight_decay_turned_off_stops_a_resume(tmp_path):
  workdir, _ = _saved_run(tmp_path, lambda saved: saved["train"].update(weight_decay=0.01))
  config = tiny.get_config()
  with pytest.raises(
      ValueError, match=re.escape(
          "config field train.weight_decay=0.0 differs from the 0.01 that the checkpoints in "
          f"{workdir} were trained with ({workdir}/config.json): the optimizer would gain or "
          "lose a transform")):
    config_changes.check_resume(run_config.validate(config), workdir, resuming=True)


def test_resume_allows_decoding_under_loss_ranking_and_a_clipping_norm_above_zero(tmp_path, caplog):
  """Without validation BLEU the beam changes no validation; a clipping norm changed above
  zero keeps the optimizer's form."""
  workdir, _ = _saved_run(
      tmp_path, lambda saved:
      (saved["decode"].update(validation_bleu=False), saved["train"].update(grad_clip_norm=1.0)))
  config = tiny.get_config()
  config.decode.update(validation_bleu=False, beam_size=1)
  config.train.grad_clip_norm = 2.0
  config_changes.check_resume(run_config.validate(config), workdir, resuming=True)
  assert "decode.beam_size=2->1" in caplog.text and "train.grad_clip_norm=1.0->2.0" in caplog.text


def test_resuming_without_config_json_stops_a_start_from_scratch_does_not(tmp_path):
  """config.json is written before the first checkpoint: checkpoints without it (deleted, a
  partial copy) were trained with a config nothing can compare the new one with."""
  config = run_config.validate(tiny.get_config())
  assert config_changes.check_resume(config, str(tmp_path), resuming=False) == []
  with pytest.raises(
      ValueError, match=re.escape(
          f"{tmp_path}/config.json is missing, but {tmp_path} holds checkpoints: the config they "
          "were trained with is unknown")):
    config_changes.check_resume(config, str(tmp_path), resuming=True)
