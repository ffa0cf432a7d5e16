"""Attention through `jax.nn.dot_product_attention` (cuDNN's fused kernel on a GPU).

The a^K term of Shaw et al. is gathered into the kernel's additive bias; cuDNN cannot add a^V
to the values, nor drop attention weights. `cudnn_unsupported` says why a call cannot run there.
"""
import jax
import jax.numpy as jnp

from relpos.kernels import distances as distances_lib


def _as_4d(x: jax.Array | None) -> jax.Array | None:
  """Adds leading axes up to rank 4 (for jax.nn.dot_product_attention)."""
  return None if x is None else x.reshape((1,) * (4 - x.ndim) + x.shape)


def cudnn_unsupported(query: jax.Array, key: jax.Array, value: jax.Array, *,
                      rel_value: jax.Array | None = None, dropout: bool = False) -> str | None:
  """Why cuDNN's fused attention cannot run this call, or None when it can.

  It needs a GPU, float16 or bfloat16 inputs of one dtype, no a^V table (its output is the
  weighted values alone), no attention dropout (`jax.nn.dot_product_attention` has none), a head
  depth that is a multiple of 8 and at most 128, and even lengths (the backward pass with a bias
  requires them) unless the query is one decode-step token.

  Args:
    query: [batch, q_len, heads, depth]; key, value: [batch, kv_len, heads, depth].
    rel_value: the a^V table or None.
    dropout: whether attention dropout is on for this call.
  """
  depth, q_len, kv_len = query.shape[-1], query.shape[1], key.shape[1]
  if jax.default_backend() != "gpu":
    return f"it needs a GPU, and JAX's backend is {jax.default_backend()!r}"
  if query.dtype not in (jnp.bfloat16, jnp.float16) or not (
      query.dtype == key.dtype == value.dtype):
    return (f"it needs float16 or bfloat16 inputs (model.dtype), got {query.dtype}, "
            f"{key.dtype}, {value.dtype}")
  if rel_value is not None:
    return "it cannot add a^V to the values (model.relative_value)"
  if dropout:
    return "it has no attention dropout (model.attention_dropout_rate)"
  if depth % 8 or depth > 128:
    return f"it needs a head depth that is a multiple of 8 and at most 128, got {depth}"
  if q_len != 1 and (q_len % 2 or kv_len % 2):
    return f"it needs even lengths, got query {q_len} and key {kv_len}"
  return None


def attention_with_bias(query: jax.Array, key: jax.Array, value: jax.Array,
                        rel_key: jax.Array | None, distances: distances_lib.Distances | None,
                        max_distance: int, bias: jax.Array | None, mask: jax.Array | None,
                        implementation: str) -> jax.Array:
  """`bias_attention` on validated inputs, with `distances` from `distances_lib.distances_of`."""
  if rel_key is not None:
    scaled = distances_lib.heads_first(query) * query.shape[-1] ** -0.5
    relative = distances_lib.relative_logits(scaled, rel_key, distances, max_distance)
    bias = relative if bias is None else relative + bias
  if mask is not None:
    mask = jnp.asarray(mask, bool)
    if implementation == "cudnn":
      mask = without_empty_rows(mask)
  return jax.nn.dot_product_attention(
      query, key, value, bias=None if bias is None else _as_4d(bias).astype(query.dtype),
      mask=_as_4d(mask), implementation=implementation)


def without_empty_rows(mask: jax.Array) -> jax.Array:
  """`mask` (bool [..., q_len, kv_len]) with each query row that may attend nowhere opened to
  every key.

  cuDNN's fused backward pass gives NaN gradients for such rows (their log-sum-exp lies below
  ln of float32's smallest normal; seen on an H200 at length 64, and reported for PyTorch's
  cuDNN attention at lengths 64 mod 128). The rows are padding queries, whose outputs no loss
  and no other position reads, so what they attend to changes no result.
  """
  return mask | ~jnp.any(mask, axis=-1, keepdims=True)


def bias_attention(query: jax.Array, key: jax.Array, value: jax.Array, *,
                   rel_key: jax.Array | None = None, max_distance: int = 0,
                   bias: jax.Array | None = None, mask: jax.Array | None = None,
                   query_positions: jax.Array | None = None,
                   key_positions: jax.Array | None = None,
                   implementation: str = "xla") -> jax.Array:
  """Attention through `jax.nn.dot_product_attention`, the a^K term gathered into its bias.

  The path `relative_dot_product_attention` takes with implementation='cudnn': the a^K logits
  q . rel_key[distance(i, j)] / sqrt(depth) ([batch, heads, q_len, kv_len]) are added to `bias`
  and cast to the inputs' dtype. Without a^V this equals `relative_dot_product_attention` up to
  that cast; on CPU it runs with implementation='xla' (tests, benchmarks).

  Args:
    query, key, value, rel_key, max_distance, bias, mask, query_positions, key_positions: as for
      `relative_dot_product_attention`.
    implementation: 'xla' or 'cudnn', passed to `jax.nn.dot_product_attention`.

  Returns:
    [batch, q_len, heads, depth] in query's dtype.
  """
  distances_lib.check_inputs(query, key, rel_key, None, max_distance, query_positions,
                             key_positions, bias)
  distances = None if rel_key is None else distances_lib.distances_of(
      query_positions, key_positions, mask, query.shape[1], key.shape[1], max_distance)
  return attention_with_bias(query, key, value, rel_key, distances, max_distance, bias, mask,
                         implementation)

