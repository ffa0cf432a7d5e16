"""Accelerator tests: cuDNN's fused attention against the XLA path, and bfloat16 training.

Skipped unless JAX's backend is a GPU; run them on one with
`JAX_PLATFORMS= python -m pytest tests/test_gpu.py` (conftest.py otherwise keeps tests on CPU),
or as the `gpu_tests` job of tools/gpu_job.py.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import ablation
from relpos import attention
from relpos import positions
from relpos.kernels import relative as kernel
from relpos.variants import alibi
from test_steps import updates_on_one_batch

pytestmark = pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")

# bfloat16 keeps 8 bits of mantissa: outputs of unit scale agree to about 1e-2.
BF16_ATOL = 0.03


def _normal(seed, shape, dtype=jnp.bfloat16):
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape, dtype=np.float32), dtype)


def _cases(length):
  arange = jnp.arange(length)[None]
  causal = jnp.tril(jnp.ones((length, length), bool))[None, None]
  return {
      "plain": {"mask": causal},
      "rel_k": {
          "rel_key": _normal(1, (2 * 16 + 1, 64), jnp.float32), "max_distance": 16, "mask": causal
      },
      "t5": {"bias": _normal(2, (1, 4, length, length), jnp.float32), "mask": causal},
      "alibi": {"bias": positions.alibi_bias(arange, arange, positions.alibi_slopes(4))},
  }


GRADIENT_NAMES = ("query", "key", "value")


def _on_cudnn_and_xla(loss, query, key, value):
  """[(gradients of `loss` in query, key, value; its aux output)] with implementation='cudnn',
  then 'xla'; `loss(implementation, query, key, value)` returns (scalar, aux)."""
  grad = jax.jit(jax.grad(loss, argnums=(1, 2, 3), has_aux=True), static_argnums=0)
  return [grad(implementation, query, key, value) for implementation in ("cudnn", "xla")]


def _assert_gradients_close(grads_cudnn, grads_xla, weight=1.0):
  """Each of cuDNN's gradients times `weight` equals XLA's within BF16_ATOL of XLA's largest."""
  for name, a, b in zip(GRADIENT_NAMES, grads_cudnn, grads_xla):
    a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    scale = float(jnp.max(jnp.abs(b)))
    np.testing.assert_allclose(a * weight / scale, b * weight / scale, atol=BF16_ATOL, err_msg=name)


@pytest.mark.parametrize("variant", ["plain", "rel_k", "t5", "alibi"])
def test_cudnn_equals_xla_forward_and_backward(variant):
  length = 64
  kwargs = _cases(length)[variant]
  query, key, value = (_normal(seed, (4, length, 4, 64)) for seed in (10, 11, 12))

  def loss(implementation, query, key, value):
    out = kernel.relative_dot_product_attention(query, key, value, implementation=implementation,
                                                **kwargs)
    return jnp.sum(out.astype(jnp.float32) * _normal(13, out.shape, jnp.float32)), out

  (grads_cudnn, out_cudnn), (grads_xla, out_xla) = _on_cudnn_and_xla(loss, query, key, value)
  np.testing.assert_allclose(out_cudnn.astype(jnp.float32), out_xla.astype(jnp.float32),
                             atol=BF16_ATOL)
  _assert_gradients_close(grads_cudnn, grads_xla)


def test_cudnn_gradients_stay_finite_with_padded_rows():
  """Packed rows ending in padding (query rows that attend nowhere) at length 64, where cuDNN's
  backward pass gave NaN: gradients finite and equal to XLA's on the real positions."""
  length = 64
  segments = jnp.where(jnp.arange(length)[None] < jnp.array([[40], [64], [10], [63]]), 1, 0)
  mask = ((segments[:, :, None] == segments[:, None, :]) & (segments[:, :, None] > 0))[:, None]
  real = segments[:, :, None, None].astype(jnp.float32)  # [batch, length, 1, 1]
  query, key, value = (_normal(seed, (4, length, 4, 64)) for seed in (40, 41, 42))

  def loss(implementation, query, key, value):
    out = kernel.relative_dot_product_attention(query, key, value, mask=mask,
                                                implementation=implementation)
    return jnp.sum(out.astype(jnp.float32) * real * _normal(43, out.shape, jnp.float32)), out

  (grads_cudnn, _), (grads_xla, _) = _on_cudnn_and_xla(loss, query, key, value)
  for name, grad in zip(GRADIENT_NAMES, grads_cudnn):
    assert bool(jnp.all(jnp.isfinite(grad))), name
  _assert_gradients_close(grads_cudnn, grads_xla, weight=real)


def test_auto_compiles_to_cudnn_where_it_can_run():
  query = _normal(20, (2, 64, 4, 64))

  def hlo(**kwargs):
    return jax.jit(lambda q: kernel.relative_dot_product_attention(q, q, q, **kwargs)).lower(
        query).compile().as_text()

  fused_attention = "__cudnn$fmha"  # the custom call's target (XLA may use cuDNN elsewhere)
  assert fused_attention in hlo(implementation="auto")
  assert fused_attention not in hlo(implementation="xla")
  table = _normal(21, (5, 64))
  assert fused_attention not in hlo(implementation="auto", rel_value=table, max_distance=2)


@pytest.mark.parametrize("row", ["abs", "rel_kv", "rel_k", "t5"])
def test_recipe_train_steps_in_bfloat16_stay_close_to_float32(row):
  """Ten steps of the Multi30K GPU recipe's model (random packed batch), bfloat16 against
  float32: losses within 2%."""
  config = ablation.get_config(f"{row},multi30k_gpu")
  config.model.dropout_rate = 0.0
  rng = np.random.default_rng(0)
  tokens = rng.integers(3, 1000, (64, 64)).astype(np.int32)
  positions_ = np.tile(np.arange(64, dtype=np.int32), (64, 1))
  batch = {
      "inputs": tokens, "targets": tokens[:, ::-1].copy(), "inputs_position": positions_,
      "targets_position": positions_, "inputs_segmentation": np.ones_like(tokens),
      "targets_segmentation": np.ones_like(tokens)
  }
  losses = {}
  for dtype in ("float32", "bfloat16"):
    config.model.dtype = dtype
    losses[dtype], _ = updates_on_one_batch(config, batch, 10)
  assert losses["float32"][-1] < losses["float32"][0]
  np.testing.assert_allclose(losses["bfloat16"], losses["float32"], rtol=0.02)


def test_bfloat16_module_with_cudnn_matches_xla_in_a_decode_step():
  module = {
      impl: attention.MultiHeadAttention(4, 256, qkv_dim=256, position=alibi.AlibiBias(4),
                                         dtype=jnp.bfloat16, implementation=impl,
                                         rngs=nnx.Rngs(0)) for impl in ("cudnn", "xla")
  }
  inputs = _normal(30, (2, 1, 256))
  outs = {}
  for impl, layer in module.items():
    cache = layer.init_cache(2, 16)
    out, _ = layer(inputs, cache=cache, cache_index=3)
    outs[impl] = out.astype(jnp.float32)
  np.testing.assert_allclose(outs["cudnn"], outs["xla"], atol=BF16_ATOL)
