"""Tests for relpos.variant_trial: a position variant of the user's own is tried on a tiny batch
before any work, and stops a program in one line naming it and its file when its code raises,
its terms have the wrong shape, or it breaks the contracts of cached decoding or packing. (The
same through train.py and --import: test_variants.py.)"""

import functools
import re

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from configs import tiny
from relpos import fields
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
      "bias has shape (3, 3, 3, 5); it must be [q_len, kv_len] or [batch or 1, heads or 1, "
      "q_len, kv_len] for [batch, heads, q_len, kv_len] = (3, 2, 3, 3).")
  config.model.position = "failing"
  with pytest.raises(
      ValueError, match=r"^position variant 'failing' \(.*test_variant_trial.py\) "
      r"fails on a trial batch, before any work at test_variant_trial.py:\d+: KeyError: "
      r"'num_heads'\.$"):
    train.train_and_evaluate(config, str(workdir))
  assert not workdir.exists()


def test_a_plug_in_that_works_is_tried_once_per_config(monkeypatch):
  variants.register("no_position_here")(_Positional)
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
  assert (logits.shape, step_logits.shape) == ((3, 4, VOCAB), (3, VOCAB))  # 2 heads + 1
  assert logits.dtype == step_logits.dtype == jnp.float32


class _DistanceBias(variants.AttentionPosition):
  """A bias of -|j - i| per head, the distances taken by `distances(query, key positions)`."""
  def __init__(self, distances):
    self.distances = distances

  def terms(self, query_positions, key_positions):
    distance = self.distances(query_positions, key_positions)  # [batch or 1, q_len, kv_len]
    return variants.AttentionTerms(bias=-jnp.abs(distance)[:, None].astype(jnp.float32))


def _relative_distances(query_positions, key_positions):
  return key_positions[:, None, :] - query_positions[:, :, None]  # [batch or 1, q_len, kv_len]


class _Positional(variants.Variant):
  """A plug-in with a bias of -|j - i| in every layer: it passes the trial."""
  def self_attention(self, num_layers, *, causal, rngs):
    return [_DistanceBias(_relative_distances) for _ in range(num_layers)]


def _distance_variant(distances):
  class DistanceVariant(variants.Variant):
    def self_attention(self, num_layers, *, causal, rngs):
      return [_DistanceBias(distances) for _ in range(num_layers)]

  return DistanceVariant


def test_a_bias_without_its_head_axis_stops_at_the_shape_trial():
  """[batch, q_len, kv_len] would broadcast against [batch, heads, q_len, kv_len] when batch is 1
  or equals the head count, each sequence's bias read as a head's: a rank-3 bias is refused."""
  class NoHeadAxis(variants.AttentionPosition):
    def terms(self, query_positions, key_positions):
      distance = key_positions[:, None, :] - query_positions[:, :, None]
      return variants.AttentionTerms(bias=-jnp.abs(distance).astype(jnp.float32))

  class NoHeadAxisVariant(variants.Variant):
    def self_attention(self, num_layers, *, causal, rngs):
      return [NoHeadAxis() for _ in range(num_layers)]

  variants.register("no_head_axis")(NoHeadAxisVariant)
  with pytest.raises(
      ValueError, match=re.escape(
          "fails on a trial batch, before any work: bias has shape (3, 3, 3); it must be [q_len, "
          "kv_len] or [batch or 1, heads or 1, q_len, kv_len] for [batch, heads, q_len, kv_len] = "
          "(3, 2, 3, 3).")):
    variant_trial.check_variant(_config("no_head_axis"))


@pytest.mark.parametrize("name, distances, problem", [
    ("own_arange", lambda q, k:
     (jnp.arange(k.shape[1])[None, None, :] - jnp.arange(q.shape[1])[None, :, None]),
     "cached decoding differs from the teacher-forced pass by up to"),
    ("first_row", lambda q, k:
     (k[:1, None, :] - q[:1, :, None]), "a packed batch differs from its sentences alone by up to"),
])
def test_a_variant_that_breaks_a_contract_stops_before_any_work(name, distances, problem):
  """Distances from jnp.arange ignore the position a decode step is given; those of the first
  row ignore the other rows' packed positions. Both shapes are right."""
  variants.register(name)(_distance_variant(distances))
  with pytest.raises(
      ValueError, match=rf"^position variant '{name}' \(.*test_variant_trial.py\) "
      rf"fails its trial on two sentence pairs, before any work: {problem} "):
    variant_trial.check_variant(_config(name))
  variants.register(f"{name}_fixed")(_distance_variant(_relative_distances))
  variant_trial.check_variant(_config(f"{name}_fixed"))  # the positions it is given: passes


class _OneLayerVariant(variants.Variant):
  """One position module for a stack of any depth: the model would build one layer."""
  def self_attention(self, num_layers, *, causal, rngs):
    return [None]


def test_a_variant_with_one_entry_for_a_deeper_stack_stops_before_any_work():
  """The model built a layer per entry: 1 layer where the config said 2, config.json unchanged."""
  variants.register("one_layer")(_OneLayerVariant)
  with pytest.raises(
      ValueError, match=re.escape(
          "fails on a trial batch, before any work: self_attention(2, causal=False) of variant "
          "'one_layer' returned 1 entries; the stack has 2 layers")):
    variant_trial.check_variant(_config("one_layer"))


class _ArrayStatistics(variants.AttentionPosition):
  def add_statistics(self, statistics, query, valid):
    statistics["mean_query"] = jnp.mean(query)  # a jax array: result.json cannot hold it


class _ArrayStatisticsVariant(variants.Variant):
  def self_attention(self, num_layers, *, causal, rngs):
    return [_ArrayStatistics() for _ in range(num_layers)]


def test_statistics_that_json_cannot_hold_stop_before_any_work():
  """They failed only after training and evaluation, and the run's result.json was lost."""
  variants.register("array_statistics")(_ArrayStatisticsVariant)
  with pytest.raises(
      ValueError, match=r"^position variant 'array_statistics' \(.*test_variant_trial.py\) fails "
      r"its trial on two sentence pairs, before any work: add_statistics stores what JSON cannot "
      r"hold \(Object of type ArrayImpl is not JSON serializable; store lists and numbers\)\.$"):
    variant_trial.check_variant(_config("array_statistics"))


def test_a_variant_registered_inside_the_relpos_package_is_tried_too(monkeypatch):
  """Built-in means of relpos's own list (variants.BUILT_IN), not of a module under relpos."""
  monkeypatch.setattr(_OneLayerVariant, "__module__", "relpos.variants.mine")
  variants.register("mine")(_OneLayerVariant)
  with pytest.raises(ValueError, match="returned 1 entries"):
    variant_trial.check_variant(_config("mine"))


def test_a_config_whose_field_holds_a_list_is_tried_once(monkeypatch):
  """Its config cannot be hashed (a list): that was a traceback, then a trial at every
  validate; now it is tried once, by the config's JSON."""
  class ListWidths(_Positional):
    fields = {
        "list_widths2": fields.Field([1, 2], fields.Rule("a list", lambda v: isinstance(v, list)),
                                     "one width a layer")
    }

  variants.register("list_widths2")(ListWidths)
  tried = []
  trial = variant_trial._trial_pass  # pylint: disable=protected-access
  monkeypatch.setattr(variant_trial, "_trial_pass", lambda config: tried.append(1) or trial(config))
  for _ in range(3):
    variant_trial.check_variant(_config("list_widths2"))
  assert tried == [1]


class LayerBound(_Positional):
  """A plug-in whose own field is bounded by the layer count."""
  fields = {"lb_layers": fields.Field(2, fields.integer(1), "layers with the bias")}

  @classmethod
  def check(cls, config) -> None:
    if config.lb_layers > config.num_encoder_layers:
      raise fields.invalid("model.lb_layers", config.lb_layers,
                           f"<= the layer count {config.num_encoder_layers}")


def test_a_rule_of_the_variant_on_the_run_sizes_holds_in_the_trial():
  """The trial's one-layer model broke the variant's rule (lb_layers=2 <= 1 layer) and told the
  user a limit they never set: where the small sizes break a rule, it tries the run's own."""
  variants.register("layer_bound")(LayerBound)
  config = model_config.TransformerConfig.from_config(
      model_fields(position="layer_bound", num_encoder_layers=2, lb_layers=2), VOCAB)
  variant_trial.check_variant(config)


class _Forgotten(variants.AttentionPosition):
  """Its method is named `term`: the model never calls it, its table never learns."""
  def __init__(self, rngs):
    self.table = nnx.Param(jax.random.normal(rngs.params(), (2, 9)))

  def term(self, query_positions, key_positions):
    del query_positions, key_positions
    return variants.AttentionTerms(bias=self.table[...][None, :, None, :1])


class _FromZero(variants.AttentionPosition):
  """A learned bias per head and clipped distance that starts at zero: no position
  information at the start, but its table learns."""
  def __init__(self, rngs):
    del rngs
    self.table = nnx.Param(jnp.zeros((2, 9)))

  def terms(self, query_positions, key_positions):
    index = jnp.clip(_relative_distances(query_positions, key_positions), -4, 4) + 4
    return variants.AttentionTerms(bias=jnp.moveaxis(self.table[...][:, index], 0, 1))


class _DecoderAlibi(variants.AttentionPosition):
  """A fixed ALiBi-like bias with no parameter: the decoder's only."""
  def terms(self, query_positions, key_positions):
    distance = jnp.abs(_relative_distances(query_positions, key_positions))
    return variants.AttentionTerms(bias=-0.5 * distance[:, None].astype(jnp.float32))


@pytest.mark.parametrize("module, refused, decoder_only", [(_Forgotten, True, False),
                                                           (_FromZero, False, False),
                                                           (_DecoderAlibi, False, True)])
def test_a_variant_that_adds_no_position_information_is_refused(module, refused, decoder_only):
  """A misspelled method trained a model without positions, silently. Positions in the
  decoder alone, with nothing to learn, were refused as if misspelled."""
  class Layers(variants.Variant):
    def self_attention(self, num_layers, *, causal, rngs):
      if decoder_only and not causal:
        return [None] * num_layers
      return [module(rngs) if module is not _DecoderAlibi else module() for _ in range(num_layers)]

  variants.register("maybe_positional")(Layers)
  if not refused:
    variant_trial.check_variant(_config("maybe_positional"))
    return
  with pytest.raises(
      ValueError, match=r"fails its trial on two sentence pairs, before any work: it adds no "
      r"position information: neither stack gets a position embedding or a self-attention "
      r"module that overrides terms or queries_and_keys \(a method name misspelled\?"):
    variant_trial.check_variant(_config("maybe_positional"))


class _ScaledByCacheLength(variants.AttentionPosition):
  """-log(1 + |j - i|) scaled by the key length: FIRE normalizes by the query's position; by
  the key length, a cache of model.max_len slots gives other terms than the full pass."""
  def terms(self, query_positions, key_positions):
    distance = jnp.abs(_relative_distances(query_positions, key_positions)).astype(jnp.float32)
    scale = jnp.log1p(max(key_positions.shape[-1], 16))
    return variants.AttentionTerms(bias=-jnp.log1p(distance)[:, None] / scale)


class _ClippedInDecodingOnly(variants.AttentionPosition):
  """-|j - i|, clipped at 8 when one query attends (a decode step): the full pass does not."""
  def terms(self, query_positions, key_positions):
    distance = jnp.abs(_relative_distances(query_positions, key_positions))
    if query_positions.shape[-1] == 1:
      distance = jnp.minimum(distance, 8)
    return variants.AttentionTerms(bias=-distance[:, None].astype(jnp.float32))


@pytest.mark.parametrize("name, module", [("by_cache_length", _ScaledByCacheLength),
                                          ("clipped_in_decoding", _ClippedInDecodingOnly)])
def test_cached_decoding_is_tried_at_decodings_cache_length_and_past_short_targets(name, module):
  """The trial decoded 5 targets into a cache of 7 slots: both variants passed it, then
  decoded otherwise than they trained (the first by up to 0.33 in logits)."""
  class Layers(variants.Variant):
    def self_attention(self, num_layers, *, causal, rngs):
      return [module() for _ in range(num_layers)]

  variants.register(name)(Layers)
  with pytest.raises(
      ValueError, match=r"fails its trial on two sentence pairs, before any work: cached "
      r"decoding differs from the teacher-forced pass by up to .* no term may depend on the "
      r"cache's length or on its slots past the step\)\.$"):
    variant_trial.check_variant(_config(name))


class _SlopeNotAParam(variants.AttentionPosition):
  """Slopes meant to be learned, written as a plain array (nnx.Param forgotten)."""
  def __init__(self, num_heads):
    self.slope = jnp.ones((num_heads,))

  def terms(self, query_positions, key_positions):
    distance = jnp.abs(_relative_distances(query_positions, key_positions)).astype(jnp.float32)
    return variants.AttentionTerms(bias=-self.slope[:, None, None] * distance[:, None])


def test_a_value_that_is_not_a_parameter_is_named_before_any_work():
  """It passed the trial, then training stopped with "Non-exhaustive filters, got a non-empty
  remainder", naming neither the variant nor the value."""
  class Layers(variants.Variant):
    def self_attention(self, num_layers, *, causal, rngs):
      return [_SlopeNotAParam(self.config.num_heads) for _ in range(num_layers)]

  variants.register("slope_not_a_param")(Layers)
  with pytest.raises(
      ValueError, match=r"before any work: decoder/layers/0/self_attention/position/slope is "
      r"neither an nnx.Param nor random state, so checkpoints and the train step would not hold "
      r"it: declare a learned value as nnx.Param"):
    variant_trial.check_variant(_config("slope_not_a_param"))


def test_an_error_in_the_variants_code_names_its_line():
  class Broken(variants.AttentionPosition):
    def terms(self, query_positions, key_positions):
      return jnp.ones((2, 5)) @ jnp.ones((3, 1))  # the line named

  class BrokenVariant(variants.Variant):
    def self_attention(self, num_layers, *, causal, rngs):
      return [Broken() for _ in range(num_layers)]

  variants.register("broken")(BrokenVariant)
  line = Broken.terms.__code__.co_firstlineno + 1
  with pytest.raises(
      ValueError, match=rf"before any work at test_variant_trial.py:{line}: "
      r"TypeError: dot_general requires contracting dimensions"):
    variant_trial.check_variant(_config("broken"))
