"""Tests for relpos.variant_trial: a position variant of the user's own is tried on a tiny batch
before any work, and stops a program in one line naming it and its file when its code raises or
its terms have the wrong shape. (The same through train.py and --import: test_variants.py.)"""

import functools

import jax
import jax.numpy as jnp
import pytest

from configs import tiny
from relpos import model_config
from relpos import train
from relpos import variant_trial
from relpos import variants
from test_model import VOCAB, model_fields

pytestmark = pytest.mark.usefixtures("variant_registry")  # conftest.py


def _config(position: str) -> model_config.TransformerConfig:
  return model_config.TransformerConfig.from_config(model_fields(position=position), VOCAB)


class WrongBias(variants.AttentionPosition):
  """A bias laid out [batch, q_len, kv_len, 5]: not [batch, heads, q_len, kv_len]."""
  def terms(self, query_positions, key_positions):
    shape = (query_positions.shape[0], query_positions.shape[1], key_positions.shape[1], 5)
    return variants.AttentionTerms(bias=jnp.zeros(shape))


class WrongBiasVariant(variants.Variant):
  def self_attention(self, num_layers, *, causal, rngs):
    return [WrongBias() for _ in range(num_layers)]


class FailingVariant(variants.Variant):
  def self_attention(self, num_layers, *, causal, rngs):
    raise KeyError("num_heads")


def test_a_variant_that_fails_a_trial_batch_stops_before_any_file(tmp_path):
  """Its bias of the wrong shape was an XLA broadcasting error naming no variant, after
  config.json and imports.json; its exception a traceback."""
  variants.register("wrong_bias")(WrongBiasVariant)
  variants.register("failing")(FailingVariant)
  config = tiny.get_config()
  config.model.position = "wrong_bias"
  workdir = tmp_path / "run"
  with pytest.raises(ValueError) as raised:
    train.train_and_evaluate(config, str(workdir))
  assert str(raised.value) == (
      f"position variant 'wrong_bias' ({__file__}) fails on a trial batch, before any work: "
      "bias has shape (1, 3, 3, 5); it must broadcast to [batch, heads, q_len, kv_len] = "
      "(2, 2, 3, 3).")
  config.model.position = "failing"
  with pytest.raises(
      ValueError, match=r"^position variant 'failing' \(.*test_variant_trial.py\) "
      r"fails on a trial batch, before any work: KeyError: "
      r"'num_heads'\.$"):
    train.train_and_evaluate(config, str(workdir))
  assert not workdir.exists()


class NoPosition(variants.Variant):
  """A plug-in that adds nothing: it passes the trial."""


def test_a_plug_in_that_works_is_tried_once_per_config(monkeypatch):
  variants.register("no_position_here")(NoPosition)
  tried = []
  trial = variant_trial._trial_pass  # pylint: disable=protected-access

  def counted(config):
    tried.append(config.position)
    return trial(config)

  monkeypatch.setattr(variant_trial, "_trial_pass", counted)
  config = _config("no_position_here")
  variant_trial.check_variant(config)
  variant_trial.check_variant(config)
  assert tried == ["no_position_here"]


def test_built_in_variants_skip_the_trial(monkeypatch):
  def refuse(config):
    raise AssertionError(f"{config.position} was tried")

  monkeypatch.setattr(variant_trial, "_trial_pass", refuse)
  for name in variants.names():
    variant_trial.check_variant(_config(name))


def test_the_trial_runs_training_and_a_cached_decode_step_on_shapes_alone():
  trial = functools.partial(variant_trial._trial_pass, _config("relative"))  # pylint: disable=protected-access
  logits, step_logits = jax.eval_shape(trial)
  assert (logits.shape, step_logits.shape) == ((2, 4, VOCAB), (2, VOCAB))
  assert logits.dtype == step_logits.dtype == jnp.float32
