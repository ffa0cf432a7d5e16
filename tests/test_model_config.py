"""Tests for relpos.model_config: from_config's field rules, old configs, cuDNN's rules."""
import logging

import jax
import pytest

from configs import default
from relpos import model_config
from test_model import VOCAB, make_config


@pytest.mark.parametrize("overrides, message", [
    ({"position": "sinusoid"}, r"model\.position='sinusoid'.*'relative'"),
    ({"absolute_type": "fixed"}, r"model\.absolute_type='fixed'.*'sinusoidal', 'learned'"),
    ({"max_relative_position": -1}, r"model\.max_relative_position=-1.*integer >= 0"),
    ({"num_heads": 3}, r"model\.num_heads=3.*divisor of model\.qkv_dim=16"),
    ({"position": "relative", "relative_key": False, "relative_value": False
     }, r"model\.relative_key=False.*relative_value"),
    ({"dropout_rate": 1.0}, r"model\.dropout_rate=1\.0.*\[0\.0, 1\.0\)"),
    ({"emb_dim": 0}, r"model\.emb_dim=0.*integer >= 1"),
    ({"num_encoder_layers": 1.5}, r"model\.num_encoder_layers=1\.5.*integer >= 1"),
    ({"relative_per_head": "yes"}, r"model\.relative_per_head='yes'.*True or False"),
    ({"position": "absolute", "emb_dim": 15, "qkv_dim": 16}, r"model\.emb_dim=15.*even"),
    ({"position": "absolute", "absolute_type": "t2t_timing_signal", "emb_dim": 15, "qkv_dim": 16
     }, r"model\.emb_dim=15.*even"),
    ({"position": "rope", "qkv_dim": 6}, r"model\.qkv_dim=6.*multiple of 2 \* model\.num_heads"),
    ({"position": "t5", "t5_num_buckets": 2}, r"model\.t5_num_buckets=2.*>= 4"),
    ({"position": "t5", "t5_max_distance": 4}, r"model\.t5_max_distance=4.*> .*= 4"),
    ({"position": "shape", "absolute_type": "learned"
     }, r"model\.absolute_type='learned'.*'sinusoidal', 't2t_timing_signal' under "
     r"model\.position='shape'"),
    ({"position": "randomized", "randomized_max_position": 31
     }, r"model\.randomized_max_position=31.*>= model\.max_len=32"),
    ({"position": "fire", "fire_init_c": 0.0}, r"model\.fire_init_c=0\.0.*\(0\.0, inf\)"),
    ({"position": "fire", "fire_init_threshold": 0.5}, r"model\.fire_init_threshold=0\.5"),
])
def test_invalid_config_raises(overrides, message):
  with pytest.raises(ValueError, match=message):
    make_config(**overrides)


def test_an_unknown_position_says_what_was_likely_meant(monkeypatch):
  """A typo of a registered name is named; a module given with --import that registered
  nothing is named, with the decorator it likely lacks."""
  with pytest.raises(
      ValueError, match=r"model\.position='alibii'.*; did you mean 'alibi'\? \(a "
      r"variant of your own: --import=<its module>\)\.$"):
    make_config(position="alibii")
  with pytest.raises(ValueError) as raised:
    make_config(position="kerple")  # no registered name is a typo of it
  assert "did you mean" not in str(raised.value)
  monkeypatch.setattr(model_config.user_modules, "_IMPORTED", ["/tmp/mine.py"])
  with pytest.raises(
      ValueError, match=r"\(/tmp/mine\.py registered no variant 'gauss': is its "
      r"class decorated with @relpos\.variants\.register\('gauss'\)\?\)\.$"):
    make_config(position="gauss")


def test_another_variants_field_is_left_out_and_logged_off_its_default(caplog):
  caplog.set_level(logging.INFO)
  config = make_config(position="t5", add_absolute=True)
  assert "add_absolute" not in config.to_dict() and "t5_num_buckets" in config.to_dict()
  assert ("config field model.add_absolute=True is left out: it is a field of position variant "
          "'relative', and model.position='t5'") in caplog.text


def test_from_config_rejects_unknown_fields_and_fills_missing_ones():
  model_cfg = default.get_config().model
  model_cfg.relative_heads = 2
  with pytest.raises(
      ValueError, match=r"unknown config field model\.relative_heads; model has: "
      r".*max_relative_position.*--import"):
    model_config.TransformerConfig.from_config(model_cfg, VOCAB)
  del model_cfg["relative_heads"]
  del model_cfg["max_relative_position"]
  config = model_config.TransformerConfig.from_config(model_cfg, VOCAB)
  assert config.max_relative_position == 16 and config.to_dict()["max_relative_position"] == 16


def test_default_config_builds():
  config = model_config.TransformerConfig.from_config(default.get_config().model, 256)
  assert config.position == "relative" and config.head_dim == 16


def test_attention_implementation_cudnn_is_refused_with_the_reason():
  with pytest.raises(ValueError, match=r"model\.attention_implementation='cudnn'.*GPU backend"):
    make_config(attention_implementation="cudnn", dtype="bfloat16")
  with pytest.raises(ValueError, match=r"model\.dtype='float64'.*'float32', 'bfloat16'"):
    make_config(dtype="float64")


@pytest.mark.parametrize("overrides,message", [
    ({"dtype": "float32"}, r"model\.dtype='float32'.*float16 or bfloat16"),
    ({"relative_value": True}, r"model\.relative_value=True.*cannot add a\^V"),
    ({"relative_value": False, "attention_dropout_rate": 0.1
     }, r"model\.attention_dropout_rate=0\.1"),
    ({"relative_value": False, "qkv_dim": 12}, r"model\.qkv_dim=12.*multiple of 8"),
])
def test_attention_implementation_cudnn_needs_what_cudnn_can_run(monkeypatch, overrides, message):
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  assert make_config(attention_implementation="cudnn", dtype="bfloat16",
                     relative_value=False).attention_implementation == "cudnn"
  with pytest.raises(ValueError, match=message):
    make_config(attention_implementation="cudnn", **{"dtype": "bfloat16", **overrides})


def test_config_written_before_the_mixed_precision_fields_still_loads():
  model_cfg = default.get_config().model
  del model_cfg["dtype"], model_cfg["attention_implementation"]
  config = model_config.TransformerConfig.from_config(model_cfg, VOCAB)
  assert (config.dtype, config.attention_implementation) == ("float32", "auto")


def test_an_override_of_a_field_the_run_lacks_is_refused_naming_both_variants():
  with pytest.raises(ValueError) as raised:
    model_config.check_fields_used({"max_relative_position": 8}, ["rope"], "--config.model.")
  assert str(raised.value) == (
      "--config.model.max_relative_position=8: a field of position variant 'relative', not of "
      "model.position='rope' (fields: rope_base): it would change nothing.")
  with pytest.raises(
      ValueError, match="of position variant 'absolute', 'relative', 'shape', "
      r"'randomized', not of model.position='none' \(no fields\)"):
    model_config.check_fields_used({"absolute_type": "learned"}, ["none"], "--config.model.")
  model_config.check_fields_used({"rope_base": 1e4}, ["kerple"], "")  # validation names it
  for overrides, positions in (
      ({"max_relative_position": 8}, ["relative"]),
      ({"absolute_type": "learned"}, ["relative"]),  # add_absolute's
      ({"num_heads": 2, "dtype": "float32"}, ["rope"]),  # architecture
      ({"rope_base": 1e4}, ["absolute", "rope"])):  # one row has it
    model_config.check_fields_used(overrides, positions, "--config.model.")
