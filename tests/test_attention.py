"""Tests for relpos.attention: MultiHeadAttention with each variant's position module (cached
decoding equals the full pass, shift invariance, sharing, dropout, dtypes, bad arguments)."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import default
from relpos import attention
from relpos import model_config
from relpos import positions
from relpos import variants
from relpos.kernels import relative as kernel
from relpos.variants import alibi
from relpos.variants import relative
from relpos.variants import rope
from relpos.variants import t5
from test_kernels import TOL, _normal, naive_relative_attention

HEADS, MODEL_DIM, QKV_DIM = 2, 8, 8
DEPTH = QKV_DIM // HEADS


def _t5_bias(rngs, seed):
  bias = t5.T5RelativeBias(HEADS, num_buckets=8, max_distance=16, bidirectional=False, rngs=rngs)
  bias.embedding[...] = _normal(seed, bias.embedding.shape)
  return bias


# Variant -> (rngs, seed) -> the layer's position module.
VARIANTS = {
    "none": lambda rngs, seed: None,
    "relative": lambda rngs, seed: relative.RelativePositionTables(2, DEPTH, rngs=rngs),
    "relative_key_only": lambda rngs, seed: relative.RelativePositionTables(
        2, DEPTH, use_value=False, rngs=rngs),
    "relative_value_only": lambda rngs, seed: relative.RelativePositionTables(
        2, DEPTH, use_key=False, rngs=rngs),
    "relative_per_head": lambda rngs, seed: relative.RelativePositionTables(
        1, DEPTH, num_heads=HEADS, rngs=rngs),
    "t5": _t5_bias,
    "rope": lambda rngs, seed: rope.Rotary(10000.0),
    "alibi": lambda rngs, seed: alibi.AlibiBias(HEADS),
}


def _from_registry(name: str):
  """The decoder's first layer position module of registered variant `name`, at this file's
  sizes (a variant without attention terms gives None)."""
  model_fields = {
      **default.get_config().model.to_dict(), "position": name, "num_heads": HEADS,
      "emb_dim": MODEL_DIM, "qkv_dim": QKV_DIM, "mlp_dim": 16, "max_len": 32
  }
  config = model_config.TransformerConfig.from_config(model_fields, vocab_size=16)

  def build(rngs, seed):
    del seed
    return variants.get(name)(config).self_attention(1, causal=True, rngs=rngs)[0]

  return build


# Every registered variant's module as the model builds it, so that a new built-in variant gets
# these tests by its file alone (the hand-made cases above pin particular options).
VARIANTS.update({f"registered_{name}": _from_registry(name) for name in variants.names()})


def _make_attention(variant, seed=0, dropout_rate=0.0):
  rngs = nnx.Rngs(params=seed, dropout=seed + 1)
  return attention.MultiHeadAttention(HEADS, MODEL_DIM, qkv_dim=QKV_DIM,
                                      position=VARIANTS[variant](rngs, seed),
                                      dropout_rate=dropout_rate, rngs=rngs)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_cached_decoding_matches_full_causal_forward(variant):
  module = _make_attention(variant)
  length, max_len = 5, 7
  x = _normal(1, (2, length, MODEL_DIM))
  full = module(x, mask=jnp.tril(jnp.ones((length, length), bool)))
  step = nnx.jit(lambda m, x, cache, i: m(x, cache=cache, cache_index=i))
  cache = module.init_cache(2, max_len)
  for i in range(length):
    out, cache = step(module, x[:, i:i + 1], cache, jnp.int32(i))
    np.testing.assert_allclose(out[:, 0], full[:, i], err_msg=f"step {i}", **TOL)
  assert cache["key"].shape == (2, max_len, HEADS, QKV_DIM // HEADS)
  np.testing.assert_array_equal(cache["key"][:, length:], 0.0)


@pytest.mark.parametrize("variant", ["relative", "relative_per_head", "t5", "rope", "alibi"])
def test_shift_invariance(variant):
  module = _make_attention(variant)
  x = _normal(2, (2, 6, MODEL_DIM))
  pos = jnp.tile(jnp.arange(6), (2, 1))
  mask = jnp.tril(jnp.ones((6, 6), bool))
  out = module(x, mask=mask, query_positions=pos)
  np.testing.assert_allclose(module(x, mask=mask, query_positions=pos + 11), out, **TOL)
  # Positions still matter: merging neighbours (distance 0 instead of -1) changes the output.
  assert not np.allclose(module(x, mask=mask, query_positions=pos // 2), out, atol=1e-4)


def test_none_ignores_positions():
  module = _make_attention("none")
  x = _normal(3, (1, 4, MODEL_DIM))
  np.testing.assert_allclose(module(x, query_positions=jnp.array([[0, 5, 9, 1]])), module(x), **TOL)


def test_cross_attention_shapes():
  module = _make_attention("none")
  x = _normal(4, (2, 3, MODEL_DIM))
  memory = _normal(5, (2, 7, MODEL_DIM))
  assert module(x, memory, mask=jnp.ones((2, 1, 1, 7), bool)).shape == (2, 3, MODEL_DIM)


def test_attention_weights_method():
  module = _make_attention("alibi")
  x = _normal(6, (1, 4, MODEL_DIM))
  weights = module.attention_weights(x)
  query, key = module.query(x), module.key(x)
  logits = jnp.einsum("bqhd,bkhd->bhqk", query, key) / math.sqrt(QKV_DIM // HEADS)
  bias = positions.alibi_bias(
      jnp.arange(4)[None],
      jnp.arange(4)[None], positions.alibi_slopes(HEADS))
  np.testing.assert_allclose(weights, jax.nn.softmax(logits + bias, axis=-1), **TOL)


@pytest.mark.parametrize(
    "max_distance, num_heads, use_key, use_value",
    [
        (2, None, True, True),
        (2, None, True, False),
        (2, None, False, True),
        (1, HEADS, True, True),
        (7, HEADS, True, True),  # k beyond every distance of 6 tokens
    ])
def test_relative_layer_follows_shaws_equations(max_distance, num_heads, use_key, use_value):
  """The layer hands its tables to the kernel as Shaw et al.'s a^K (logits) and a^V (values):
  its output equals eqs. 3-5 written out (`naive_relative_attention`) on the layer's own
  projections and tables, followed by its output projection; with packed positions, padding
  and a causal mask."""
  rngs = nnx.Rngs(params=3)
  tables = relative.RelativePositionTables(max_distance, DEPTH, num_heads=num_heads,
                                           use_key=use_key, use_value=use_value, rngs=rngs)
  for seed, table in enumerate((tables.rel_key, tables.rel_value)):  # beyond the init's scale
    if table is not None:
      table[...] = _normal(seed, table.shape)
  module = attention.MultiHeadAttention(HEADS, MODEL_DIM, qkv_dim=QKV_DIM, position=tables,
                                        rngs=rngs)
  x = _normal(5, (2, 6, MODEL_DIM))
  pos = jnp.array([[0, 1, 2, 3, 4, 5], [0, 1, 2, 0, 1, 0]])  # row 1: segments 3 + 2, padding
  segments = jnp.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 2, 2, 0]])
  mask = ((segments[:, None, :, None] == segments[:, None, None, :]) &
          jnp.tril(jnp.ones((6, 6), bool)))
  got = module(x, mask=mask, query_positions=pos)
  want = module.out(
      naive_relative_attention(module.query(x), module.key(x), module.value(x),
                               None if tables.rel_key is None else tables.rel_key[...],
                               None if tables.rel_value is None else tables.rel_value[...],
                               max_distance, mask=mask, query_positions=pos, key_positions=pos))
  np.testing.assert_allclose(got, want, **TOL)


def test_relative_table_shapes_and_sharing():
  rngs = nnx.Rngs(0)
  shared = relative.RelativePositionTables(3, 4, rngs=rngs)
  assert shared.rel_key.shape == shared.rel_value.shape == (7, 4)
  per_head = relative.RelativePositionTables(3, 4, num_heads=2, use_value=False, rngs=rngs)
  assert per_head.rel_key.shape == (2, 7, 4) and per_head.rel_value is None
  k0 = relative.RelativePositionTables(0, 4, use_key=False, rngs=rngs)
  assert k0.rel_key is None and k0.rel_value.shape == (1, 4)

  def count(module):
    return sum(x.size for x in jax.tree.leaves(nnx.state(module, nnx.Param)))

  assert count(shared) == 2 * 7 * 4
  assert count(per_head) == 2 * 7 * 4

  class TwoLayers(nnx.Module):
    def __init__(self, tables):
      self.a = attention.MultiHeadAttention(2, 8, qkv_dim=8, position=tables, rngs=rngs)
      self.b = attention.MultiHeadAttention(2, 8, qkv_dim=8, position=tables, rngs=rngs)

  tables = relative.RelativePositionTables(3, 4, rngs=rngs)
  two = TwoLayers(tables)
  projections = 2 * 4 * 8 * 8
  assert count(two) == projections + 2 * 7 * 4  # the shared tables are counted once
  assert two.a.position is two.b.position


def test_t5_bias_values():
  rngs = nnx.Rngs(0)
  bias = t5.T5RelativeBias(3, num_buckets=8, max_distance=16, bidirectional=True, rngs=rngs)
  assert bias.embedding.shape == (8, 3)
  bias.embedding[...] = jnp.arange(24, dtype=jnp.float32).reshape(8, 3)
  qpos, kpos = jnp.array([[0, 3]]), jnp.array([[0, 1, 9]])
  bias_values = bias(qpos, kpos)
  assert bias_values.shape == (1, 3, 2, 3)
  buckets = positions.t5_relative_position_bucket(jnp.array([[0, 1, 9], [-3, -2, 6]]),
                                                  num_buckets=8, max_distance=16)
  for h in range(3):
    np.testing.assert_array_equal(bias_values[0, h], 3 * buckets + h)


def test_module_dropout():
  module = _make_attention("relative", dropout_rate=0.5)
  x = _normal(7, (1, 4, MODEL_DIM))
  np.testing.assert_allclose(module(x), module(x, deterministic=True))
  first, second = module(x, deterministic=False), module(x, deterministic=False)
  assert not np.allclose(first, second) and not np.allclose(first, module(x))


def test_invalid_module_arguments():
  rngs = nnx.Rngs(0)
  tables = relative.RelativePositionTables(2, 4, rngs=rngs)
  with pytest.raises(ValueError, match="AttentionPosition"):
    attention.MultiHeadAttention(2, 8, qkv_dim=8, position="relative", rngs=rngs)
  with pytest.raises(ValueError, match="qkv_dim"):
    attention.MultiHeadAttention(3, 8, qkv_dim=8, rngs=rngs)
  with pytest.raises(ValueError, match="depth 8"):
    attention.MultiHeadAttention(2, 16, qkv_dim=16, position=tables, rngs=rngs)
  with pytest.raises(ValueError, match="T5 bias has num_heads=3"):
    attention.MultiHeadAttention(
        2, 8, qkv_dim=8, rngs=rngs, position=t5.T5RelativeBias(3, num_buckets=8, max_distance=16,
                                                               bidirectional=True, rngs=rngs))
  with pytest.raises(ValueError, match="even head dim"):
    attention.MultiHeadAttention(2, 6, qkv_dim=6, position=rope.Rotary(10000.0), rngs=rngs)
  with pytest.raises(ValueError, match="dropout_rate"):
    attention.MultiHeadAttention(2, 8, qkv_dim=8, dropout_rate=1.5, rngs=rngs)
  with pytest.raises(ValueError, match="max_distance"):
    relative.RelativePositionTables(-1, 4, rngs=rngs)
  with pytest.raises(ValueError, match="use_key and use_value"):
    relative.RelativePositionTables(2, 4, use_key=False, use_value=False, rngs=rngs)
  with pytest.raises(ValueError, match="num_buckets"):
    t5.T5RelativeBias(2, num_buckets=2, bidirectional=True, rngs=rngs)
  module = attention.MultiHeadAttention(2, 8, qkv_dim=8, rngs=rngs)
  cache = module.init_cache(1, 4)
  x = jnp.ones((1, 1, 8))
  with pytest.raises(ValueError, match="inputs_kv"):
    module(x, x, cache=cache, cache_index=0)
  with pytest.raises(ValueError, match="cache_index"):
    module(x, cache=cache)
  with pytest.raises(ValueError, match="inputs_q"):
    module(jnp.ones((1, 2, 8)), cache=cache, cache_index=0)
  with pytest.raises(ValueError, match="implementation must be one of"):
    attention.MultiHeadAttention(2, 8, qkv_dim=8, implementation="flash", rngs=nnx.Rngs(0))


def test_bfloat16_module_keeps_float32_parameters_and_a_bfloat16_cache():
  module = attention.MultiHeadAttention(
      2, 16, qkv_dim=16, position=relative.RelativePositionTables(2, 8, rngs=nnx.Rngs(0)),
      dtype=jnp.bfloat16, rngs=nnx.Rngs(1))
  params = nnx.state(module, nnx.Param)
  assert {leaf.dtype for leaf in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}
  cache = module.init_cache(2, 6)
  assert cache["key"].dtype == cache["value"].dtype == jnp.bfloat16
  out, cache = module(_normal(34, (2, 1, 16)), cache=cache, cache_index=0)
  assert out.dtype == jnp.bfloat16 and cache["key"].dtype == jnp.bfloat16


def test_the_kernel_keeps_its_public_name():
  assert attention.relative_dot_product_attention is kernel.relative_dot_product_attention
