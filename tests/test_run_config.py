"""Tests for relpos.run_config: each field's rule, rules across fields, old configs, resuming."""
import json
import os
import math
import re

import pytest

from configs import default
from configs import tiny
from relpos import run_config

# One invalid value per validated field (outside model.*, which TransformerConfig checks).
INVALID = {
    "seed": -1,
    "task.name": "wmt15",
    "task.tfds_data_dir": 3,
    "task.source_lang": "",
    "task.target_lang": "",
    "task.manual_dir": None,
    "task.download_url": 1,
    "task.vocab_size": 4,
    "task.spm_model_type": "wordpiece",
    "task.max_length": 1,
    "task.overlong": "drop",
    "task.packing": 1,
    "task.shuffle_buffer_seed": -2,
    "task.spm_seed": -3,
    "task.concat_probability": 1.5,
    "task.synthetic.seed": 1.5,
    "task.synthetic.num_train": 0,
    "task.synthetic.num_validation": 0,
    "task.synthetic.num_test": 0,
    "task.synthetic.num_test_long": 0,
    "task.synthetic.num_test_long_seen": -1,
    "task.synthetic.min_words": 0,
    "task.synthetic.max_words": 0,
    "task.synthetic.long_min_words": 0,
    "task.synthetic.long_max_words": 0,
    "train.batch_size": 0,
    "train.num_steps": 0,
    "train.learning_rate": 0.0,
    "train.warmup_steps": 0,
    "train.adam_b1": 1.0,
    "train.adam_b2": -0.1,
    "train.adam_eps": 0.0,
    "train.weight_decay": -1.0,
    "train.label_smoothing": 1.0,
    "train.grad_clip_norm": math.inf,
    "train.nonfinite": "ignore",
    "train.max_skipped_fraction": 1.5,
    "train.grad_accumulation_steps": 0,
    "train.early_stopping_patience": -1,
    "train.log_every_steps": 0,
    "train.eval_every_steps": 0,
    "train.checkpoint_every_steps": 0,
    "train.keep_checkpoints": 0,
    "train.eval_batch_size": 0,
    "decode.beam_size": 0,
    "decode.checkpoint": "average:1",
    "decode.alpha": -0.5,
    "decode.max_decode_len": -1,
    "decode.validation_bleu": "yes",
    "decode.other_checkpoints": "best,average:x",
    "decode.length_diagnostics": "yes",
}


def _set(config, path, value):
  *parents, leaf = path.split(".")
  node = config
  for name in parents:
    node = node[name]
  with node.ignore_type():
    node[leaf] = value


FIELDS = {
    f"{section}.{name}" if section else name: field
    for section, declared in run_config.SECTIONS.items() for name, field in declared.items()
}


def test_every_rule_has_an_invalid_case():
  assert set(INVALID) == set(FIELDS)


@pytest.mark.parametrize("path", sorted(INVALID))
def test_invalid_value_names_field_and_allowed_values(path):
  config = default.get_config()
  _set(config, path, INVALID[path])
  rule = FIELDS[path].rule
  with pytest.raises(ValueError) as error:
    run_config.validate(config)
  assert f"config field {path}={INVALID[path]!r} is invalid" in str(error.value)
  assert rule.allowed in str(error.value)


@pytest.mark.parametrize("path,value,message", [
    ("model.position", "sinusoid", "config field model.position='sinusoid' is invalid"),
    ("model.num_heads", 3, "config field model.num_heads=3 is invalid"),
    ("model.max_relative_position", -1, "config field model.max_relative_position=-1"),
])
def test_model_fields_are_validated(path, value, message):
  config = default.get_config()
  _set(config, path, value)
  with pytest.raises(ValueError, match=message):
    run_config.validate(config)


@pytest.mark.parametrize("task, field, value", [
    ("synthetic", "source_lang", "fr"),
    ("synthetic", "target_lang", "en"),
    ("synthetic", "manual_dir", "../shared/data/multi30k"),
    ("wmt14", "download_url", "https://example.org/multi30k"),
    ("multi30k", "synthetic.num_train", 256),
])
def test_a_task_field_the_task_does_not_read_is_refused(task, field, value):
  """A field set under a task that ignores it would be a silently ignored setting."""
  config = default.get_config()
  config.task.name = task
  _set(config, f"task.{field}", value)
  words = re.escape(f"config field task.{field}={value!r} changes nothing under "
                    f"task.name='{task}' (read by ")
  with pytest.raises(ValueError, match=f"^{words}.* only\\); leave it at "):
    run_config.validate(config)
  section, _, name = f"task.{field}".rpartition(".")
  _set(config, f"task.{field}", run_config.SECTIONS[section][name].default)
  run_config.validate(config)  # at its default it is accepted


def test_cross_field_rules():
  config = default.get_config()
  config.task.synthetic.min_words = 20
  with pytest.raises(ValueError, match="task.synthetic.min_words=20 must be <= "
                     "task.synthetic.max_words=12"):
    run_config.validate(config)
  config = default.get_config()
  config.decode.max_decode_len = 300
  with pytest.raises(ValueError, match="decode.max_decode_len=300 must be <= model.max_len=256"):
    run_config.validate(config)
  for name, value in (("checkpoint", "average:3"), ("other_checkpoints", "latest,average:10")):
    config = default.get_config()
    config.decode[name] = value
    with pytest.raises(
        ValueError, match=f"decode.{name}='{value}' averages more checkpoints "
        r"than train.keep_checkpoints=2 keeps\."):
      run_config.validate(config)
    config.train.keep_checkpoints = 10
    with pytest.raises(
        ValueError, match=(rf"decode.{name}='{value}' averages more checkpoints "
                           r"than the 2 a run saves on schedule")):
      run_config.validate(config)
    config.train.checkpoint_every_steps = 100
    run_config.validate(config)


def test_unknown_and_missing_fields():
  config = default.get_config()
  config.train.lr = 0.1
  with pytest.raises(ValueError, match="unknown config field train.lr; train has: batch_size"):
    run_config.validate(config)
  config = default.get_config()
  del config.decode["alpha"]  # a config.json written before the field: its value then
  assert run_config.validate(config).decode.alpha == run_config.SECTIONS["decode"]["alpha"].default
  del config["decode"]
  with pytest.raises(ValueError, match="config section decode is missing"):
    run_config.validate(config)


def test_config_written_before_the_new_train_fields_still_validates():
  config = tiny.get_config()
  del config.train["grad_accumulation_steps"], config.train["early_stopping_patience"]
  validated = run_config.validate(config)
  assert (validated.train.grad_accumulation_steps, validated.train.early_stopping_patience) == (1,
                                                                                                0)
  assert "grad_accumulation_steps" not in config.train  # what it was given is left as it is


def _saved_run(tmp_path, edit=lambda saved: None) -> tuple[str, dict]:
  """A workdir holding the tiny config's config.json after `edit(saved dict)`."""
  saved = run_config.validate(tiny.get_config()).to_dict()
  edit(saved)
  with open(tmp_path / "config.json", "w", encoding="utf-8") as f:
    json.dump(saved, f)
  return str(tmp_path), saved


def test_a_run_trained_with_cudnn_is_read_on_a_cpu_as_auto(tmp_path, caplog):
  """Evaluating (or resuming) a GPU run on a CPU: its kernel choice is of the machine, and
  'auto' computes the same function; any other fault of the file is still named."""
  workdir, _ = _saved_run(
      tmp_path,
      lambda saved: saved["model"].update(attention_implementation="cudnn", dtype="bfloat16"))
  config = run_config.read(os.path.join(workdir, "config.json"))
  assert config.model.attention_implementation == "auto" and config.model.dtype == "bfloat16"
  assert "trained with cuDNN attention, which cannot run here (" in caplog.text
  workdir, _ = _saved_run(
      tmp_path,
      lambda saved: saved["model"].update(attention_implementation="cudnn", dropout_rate=2.0))
  with pytest.raises(ValueError, match=rf"^{workdir}/config.json: config field model.dropout_rate"):
    run_config.read(os.path.join(workdir, "config.json"))
