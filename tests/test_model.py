"""Tests for relpos.model (every position variant) and relpos.decode.translate.

Tiny models (emb 16, 2 heads, 2 + 2 layers, vocab 20) run eagerly, so each shape compiles once
per primitive and the variants share those compilations.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import default
from relpos import decode
from relpos import model as model_lib
from relpos import model_config
from relpos import positions as positions_lib
from relpos import variant_trial
from relpos import variants
from relpos.variants import relative

VOCAB = 20
EOS = 1
TINY = {
    "emb_dim": 16, "num_heads": 2, "qkv_dim": 16, "mlp_dim": 32, "num_encoder_layers": 2,
    "num_decoder_layers": 2, "max_len": 32, "max_relative_position": 2, "t5_num_buckets": 8,
    "t5_max_distance": 12
}
VARIANTS = {
    "absolute_sinusoidal": {"position": "absolute"},
    "absolute_learned": {"position": "absolute", "absolute_type": "learned"},
    "absolute_t2t": {"position": "absolute", "absolute_type": "t2t_timing_signal"},
    "relative_kv": {"position": "relative"},
    "relative_k": {"position": "relative", "relative_value": False},
    "relative_v": {"position": "relative", "relative_key": False},
    "relative_per_head": {"position": "relative", "relative_per_head": True},
    "relative_shared_layers": {"position": "relative", "relative_shared_across_layers": True},
    "abs_relative": {"position": "relative", "add_absolute": True},
    "relative_post_ln_unshared": {
        "position": "relative", "pre_layer_norm": False, "share_embeddings": False,
        "logits_via_embedding": False
    },
    "t5": {"position": "t5"},
    "t5_per_layer": {"position": "t5", "t5_shared_across_layers": False},
    "rope": {"position": "rope"},
    "alibi": {"position": "alibi"},
    "none": {"position": "none"},
    "fire": {"position": "fire", "fire_hidden": 8},
    # L = 1: the normaliser psi(max(L, i, j)) moves with the positions of these short sequences
    # (at the default L = 16 every one of them shares psi(16)).
    "fire_threshold_1": {"position": "fire", "fire_hidden": 8, "fire_init_threshold": 1.0},
    "shape": {"position": "shape"},
    "shape_t2t": {"position": "shape", "absolute_type": "t2t_timing_signal"},
    "randomized": {"position": "randomized"},
    "randomized_stride": {"position": "randomized", "randomized_eval_stride": 3},
}
# Every registered variant at its defaults, unless a case above has it: a new built-in variant
# gets the contract tests (cache equals the full pass, packed equals unpacked, ...) by its file.
VARIANTS.update({
    name: {"position": name} for name in variants.names() if all(case["position"] != name
                                                                for case in VARIANTS.values())
})
ATOL = 2e-5

# Two source / target pairs; row 0 pads inputs and targets (the variant trial's).
INPUTS, TARGETS = variant_trial.INPUTS, variant_trial.TARGETS
cached_and_full_logits = variant_trial.cached_and_full_logits


def model_fields(**overrides) -> dict:
  """`config.model` of the default config with TINY's sizes (its variant options where the
  variant `overrides` select has them) and `overrides`."""
  model_cfg = {**default.get_config().model.to_dict(), **overrides}
  position = model_cfg["position"]
  own = variants.get(position).fields if position in variants.names() else {}
  tiny = {k: v for k, v in TINY.items() if k in model_config.FIELDS or k in own}
  return {**model_cfg, **tiny, **overrides}


def make_config(**overrides) -> model_config.TransformerConfig:
  return model_config.TransformerConfig.from_config(model_fields(**overrides), VOCAB)


def make_model(seed: int = 0, **overrides) -> model_lib.Transformer:
  return model_lib.Transformer(make_config(**overrides), rngs=nnx.Rngs(seed))


@pytest.mark.parametrize("variant", VARIANTS)
def test_cached_decoding_equals_full_forward(variant):
  np.testing.assert_allclose(*cached_and_full_logits(make_model(**VARIANTS[variant])), atol=ATOL)


@pytest.mark.parametrize("variant", VARIANTS)
def test_packed_equals_unpacked(variant):
  np.testing.assert_allclose(
      *variant_trial.packed_and_alone_logits(make_model(**VARIANTS[variant])), atol=ATOL)


@pytest.mark.parametrize("variant", VARIANTS)
def test_encoder_shift_invariance_and_distances(variant):
  """Positions shifted by 7 change only an absolute encoder's output, and FIRE's past its
  threshold L (its normaliser psi(max(L, i, j)) reads the positions themselves; below L = 16
  all of 0..12 share psi(16)); positions spread twice as far apart (the distances 1 and 2
  differ under ALiBi and the clipped tables too) change every position-aware encoder's output,
  and nothing under `none`."""
  model = make_model(**VARIANTS[variant])
  positions = np.arange(INPUTS.shape[1])[None] + np.zeros_like(INPUTS)
  reference = model.encode(INPUTS, inputs_positions=positions)
  shifted = model.encode(INPUTS, inputs_positions=positions + 7)
  case = VARIANTS[variant]
  reads_positions = (case["position"] == "fire" and
                     case.get("fire_init_threshold", 16.0) < (positions + 7).max())
  if model.encoder.position_embedding is not None or reads_positions:
    assert np.abs(shifted - reference).max() > 1e-2
  else:
    np.testing.assert_allclose(shifted, reference, atol=ATOL)
  spread = model.encode(INPUTS, inputs_positions=2 * positions)
  if VARIANTS[variant]["position"] == "none":
    np.testing.assert_allclose(spread, reference, atol=ATOL)
  else:
    assert np.abs(spread - reference).max() > 1e-2


@pytest.mark.parametrize("absolute_type, encoding", [
    ("sinusoidal", positions_lib.sinusoidal_position_encoding),
    ("t2t_timing_signal", positions_lib.t2t_timing_signal),
])
def test_absolute_type_selects_the_encoding(absolute_type, encoding):
  model = make_model(position="absolute", absolute_type=absolute_type)
  at = jnp.array([[0, 3, 40]])
  np.testing.assert_array_equal(model.encoder.position_embedding(at), encoding(at, 16))


def parameter_sizes(model: nnx.Module, name: str) -> list[int]:
  """Sizes of the parameters called `name` (shared instances counted once)."""
  return [
      variable[...].size
      for path, variable in nnx.state(model, nnx.Param).flat_state()
      if path[-1] == name
  ]


@pytest.mark.parametrize("overrides, per_table, tables, value_tables", [
    ({}, (2 * 3 + 1) * 8, 4, 4),
    ({"max_relative_position": 0}, 1 * 8, 4, 4),
    ({"relative_per_head": True}, 2 * (2 * 3 + 1) * 8, 4, 4),
    ({"relative_shared_across_layers": True}, (2 * 3 + 1) * 8, 1, 1),
    ({"relative_value": False}, (2 * 3 + 1) * 8, 4, 0),
])
def test_relative_table_parameter_counts(overrides, per_table, tables, value_tables):
  # depth = qkv_dim / heads = 8; 2 encoder + 2 decoder self-attention layers.
  model = make_model(**{"position": "relative", "max_relative_position": 3, **overrides})
  assert parameter_sizes(model, "rel_key") == [per_table] * tables
  assert parameter_sizes(model, "rel_value") == [per_table] * value_tables


@pytest.mark.parametrize("shared, tables", [(True, 2), (False, 4)])
def test_t5_bias_parameter_counts(shared, tables):
  model = make_model(position="t5", t5_shared_across_layers=shared)
  assert parameter_sizes(model, "embedding") == [VOCAB * 16] + [8 * 2] * tables
  encoder_bias = model.encoder.layers[0].self_attention.position
  decoder_bias = model.decoder.layers[0].self_attention.position
  assert encoder_bias.bidirectional and not decoder_bias.bidirectional
  assert (model.encoder.layers[1].self_attention.position is encoder_bias) == shared
  assert (model.decoder.layers[1].self_attention.position is decoder_bias) == shared


def test_cross_attention_has_no_position_terms():
  model = make_model(position="relative")
  for layer in model.decoder.layers:
    assert layer.cross_attention.position is None
    assert isinstance(layer.self_attention.position, relative.RelativePositionTables)


def test_dropout_only_in_training():
  model = make_model(position="relative", dropout_rate=0.3)
  eval_logits = model(INPUTS, TARGETS)
  np.testing.assert_array_equal(eval_logits, model(INPUTS, TARGETS))
  first = model(INPUTS, TARGETS, deterministic=False)
  second = model(INPUTS, TARGETS, deterministic=False)
  assert np.abs(first - second).max() > 1e-3 and np.abs(first - eval_logits).max() > 1e-3


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("arguments, message", [
    ({"inputs": jnp.zeros((2, 0), jnp.int32)}, r"inputs must be int32 \[batch, src_len\] with "
     r"src_len >= 1, got shape \(2, 0\)"),
    ({"max_decode_len": 1000}, "max_decode_len=1000 exceeds model.max_len="),
    ({"min_len": [1, 2, 3]}, r"min_len must be int32 \[batch=2\], got shape \(3,\)"),
    ({"min_len": [3, 3], "max_len": [2, 5]}, r"1 <= min_len <= max_len <= max_decode_len=6; "
     "row 0 has min_len 3, max_len 2"),
    ({"max_len": [4, 7]}, "row 1 has min_len 1, max_len 7"),
    ({"min_len": [0, 2]}, "row 0 has min_len 0"),
])
def test_translate_refuses_what_it_cannot_decode(use_cache, arguments, message):
  """Refused before tracing, the uncached reference as the cached search (before, a source
  without tokens failed deep in jit, bounds that allow no length emitted padding, and only the
  cached search checked max_len)."""
  model = make_model(position="relative", num_encoder_layers=1)
  inputs = jnp.array([[3, 4, 1], [5, 1, 0]])
  with pytest.raises(ValueError, match=message):
    decode.translate(
        model, **{
            "inputs": inputs, "max_decode_len": 6, "beam_size": 2, "use_cache": use_cache,
            **arguments
        })


@pytest.mark.parametrize("beam_size", [1, 4])
def test_translate_equals_uncached_search(beam_size):
  model = make_model(position="relative", num_encoder_layers=1, logits_via_embedding=False)
  # A slight eos preference so that some outputs end early (eos, then padding).
  model.decoder.logits.bias[...] = jnp.zeros(VOCAB).at[EOS].set(-0.75)
  inputs = jnp.array([[3, 4, 5, 6, 1, 0], [7, 8, 1, 0, 0, 0], [9, 10, 11, 12, 13, 1]])
  tokens = decode.translate(model, inputs, beam_size=beam_size, max_decode_len=8)
  assert tokens.shape == (3, 8) and tokens.dtype == jnp.int32
  uncached = decode.translate(model, inputs, beam_size=beam_size, max_decode_len=8, use_cache=False)
  np.testing.assert_array_equal(tokens, uncached)
  ended = 0
  for row in np.asarray(tokens):
    if EOS in row:
      end = list(row).index(EOS)
      assert end >= 1 and not row[end + 1:].any()
      ended += 1
  assert ended >= 1

  compiled = decode._translate._cache_size()
  decode.translate(model, inputs[::-1], beam_size=beam_size, max_decode_len=8)
  assert decode._translate._cache_size() == compiled  # same shapes: no retracing.


def _first_case(position: str) -> str:
  return next(name for name, case in VARIANTS.items() if case["position"] == position)


# Every registered variant (its first case above), and FIRE at L = 1, whose normaliser moves with
# every decoded position (at L = 16 it moves from position 17 on, by little).
SEARCH_VARIANTS = [*map(_first_case, variants.names()), "fire_threshold_1"]


@pytest.mark.parametrize("variant", SEARCH_VARIANTS)
def test_beam_search_equals_uncached_search_past_position_16(variant):
  """Cached beam search equals the search without a cache, past FIRE's default threshold
  L = 16 (there its normaliser reads the query's position, a decode step's `cache_index`)."""
  model = make_model(**VARIANTS[variant], num_encoder_layers=1, num_decoder_layers=1,
                     logits_via_embedding=False)
  model.decoder.logits.bias[...] = jnp.zeros(VOCAB).at[EOS].set(-0.75)
  inputs = jnp.array([[3, 4, 5, 6, 1, 0], [9, 10, 11, 12, 13, 1]])
  tokens = np.asarray(decode.translate(model, inputs, beam_size=2, max_decode_len=20))
  assert (tokens != 0).sum(1).max() > 16  # an output reached past position 16
  np.testing.assert_array_equal(
      tokens, decode.translate(model, inputs, beam_size=2, max_decode_len=20, use_cache=False))


@pytest.mark.parametrize("beam_size", [1, 3])
def test_translate_with_oracle_lengths_ends_each_output_at_its_length(beam_size):
  model = make_model(position="relative", num_encoder_layers=1, logits_via_embedding=False)
  model.decoder.logits.bias[...] = jnp.zeros(VOCAB).at[EOS].set(3.0)  # eos comes first
  inputs = jnp.array([[3, 4, 5, 6, 1, 0], [7, 8, 1, 0, 0, 0], [9, 10, 11, 12, 13, 1]])
  plain = np.asarray(decode.translate(model, inputs, beam_size=beam_size, max_decode_len=8))
  assert (plain[:, 0] == EOS).all()  # unbounded, every output is empty
  lengths = np.array([5, 2, 8])
  tokens = np.asarray(
      decode.translate(model, inputs, beam_size=beam_size, max_decode_len=8, min_len=lengths,
                       max_len=lengths))
  for row, length in zip(tokens, lengths):
    assert list(row).index(EOS) == length - 1 and not row[length:].any()


# Mixed precision: bfloat16 against float32 on the same float32 parameters. Tolerance: the
# logits of the tiny model (magnitude about 1-3) within 0.1, and the next-token probabilities
# within 0.02: bfloat16 keeps 8 bits of mantissa, so each activation is off by up to 0.4%.
BF16_LOGIT_ATOL = 0.1
BF16_PROBABILITY_ATOL = 0.02
MIXED_PRECISION_VARIANTS = [
    "absolute_sinusoidal", "relative_kv", "relative_per_head", "t5", "rope", "alibi", "none"
]


@pytest.mark.parametrize("variant", MIXED_PRECISION_VARIANTS)
def test_bfloat16_forward_is_close_to_float32(variant):
  full = make_model(**VARIANTS[variant])
  half = make_model(**VARIANTS[variant], dtype="bfloat16")
  params = nnx.state(half, nnx.Param)
  assert {leaf.dtype for leaf in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}
  assert all(
      jnp.array_equal(a, b)
      for a, b in zip(jax.tree.leaves(nnx.state(full, nnx.Param)), jax.tree.leaves(params)))
  assert half.encode(INPUTS).dtype == jnp.bfloat16
  want, got = full(INPUTS, TARGETS), half(INPUTS, TARGETS)
  assert got.dtype == jnp.float32
  real = TARGETS != 0
  np.testing.assert_allclose(got[real], want[real], atol=BF16_LOGIT_ATOL)
  np.testing.assert_allclose(
      jax.nn.softmax(got)[real],
      jax.nn.softmax(want)[real], atol=BF16_PROBABILITY_ATOL)


@pytest.mark.parametrize("variant", ["relative_kv", "t5", "rope"])
def test_bfloat16_cached_decoding_equals_full_forward(variant):
  model = make_model(**VARIANTS[variant], dtype="bfloat16")
  assert all(leaf.dtype == jnp.bfloat16 for leaf in jax.tree.leaves(model.init_cache(2, 7)))
  # The same bfloat16 arithmetic, one token at a time (op by op, as the full pass runs):
  # measured equal (0.0) on CPU; float32's tolerance leaves room for another order of
  # summation on other backends.
  np.testing.assert_allclose(*cached_and_full_logits(model, compiled=False), atol=ATOL)
  tokens = decode.translate(model, INPUTS, beam_size=2, max_decode_len=6)
  assert tokens.shape == (2, 6)
