"""Attention through `jax.nn.dot_product_attention` (cuDNN's fused kernel on a GPU).

The a^K term of Shaw et al. is gathered into the kernel's additive bias; cuDNN cannot add a^V
to the values, nor drop attention weights. `cudnn_unsupported` says why a call cannot run there.
"""
from typing import Any

import jax
import jax.numpy as jnp

from relpos.kernels import distances as distances_lib


def _as_4d(x: jax.Array | None) -> jax.Array | None:
  """Adds leading axes up to rank 4 (for jax.nn.dot_product_attention)."""
  return None if x is None else x.reshape((1,) * (4 - x.ndim) + x.shape)


def cudnn_requirement(*, backend: str, dtypes: tuple[Any, ...], depth: int, value_table: bool,
                      dropout: bool, q_len: int | None = None,
                      kv_len: int | None = None) -> tuple[str, str] | None:
  """The first thing cuDNN's fused attention needs that a call lacks, or None when it can run.

  It needs a GPU, float16 or bfloat16 inputs of one dtype, no value table (its output is the
  weighted values alone), no attention dropout (`jax.nn.dot_product_attention` has none), a
  head depth that is a multiple of 8 and at most 128, and even lengths (the backward pass with a
  bias requires them) unless the query is one decode-step token. The one statement of these
  rules: the per-call check (`cudnn_unsupported`) and a model's config
  (`relpos.model_config.check_cudnn`) both ask here.

  Args:
    backend: JAX's default backend.
    dtypes: the dtypes of query, key and value (or the one compute dtype).
    depth: the head depth.
    value_table: whether a table is added to the values (Shaw et al.'s a^V).
    dropout: whether attention dropout is on.
    q_len, kv_len: the lengths of the call (None: not checked).

  Returns:
    (what: "backend" | "dtype" | "value_table" | "dropout" | "depth" | "lengths", why).
  """
  if backend != "gpu":
    return "backend", f"it needs a GPU backend, and JAX's backend is {backend!r}"
  if dtypes[0] not in (jnp.bfloat16, jnp.float16) or len(set(dtypes)) != 1:
    return "dtype", (f"it needs float16 or bfloat16 inputs of one dtype, got "
                     f"{', '.join(map(str, dtypes))}")
  if value_table:
    return "value_table", "it cannot add a^V (a table of the values) to the values"
  if dropout:
    return "dropout", "it has no attention dropout"
  if depth % 8 or depth > 128:
    return "depth", f"it needs a head depth that is a multiple of 8 and at most 128, got {depth}"
  if q_len is not None and q_len != 1 and (q_len % 2 or kv_len % 2):
    return "lengths", f"it needs even lengths, got query {q_len} and key {kv_len}"
  return None


def cudnn_unsupported(query: jax.Array, key: jax.Array, value: jax.Array, *,
                      rel_value: jax.Array | None = None, dropout: bool = False) -> str | None:
  """Why cuDNN's fused attention cannot run this call (`cudnn_requirement`), or None.

  Args:
    query: [batch, q_len, heads, depth]; key, value: [batch, kv_len, heads, depth].
    rel_value: the a^V table or None.
    dropout: whether attention dropout is on for this call.
  """
  need = cudnn_requirement(backend=jax.default_backend(),
                           dtypes=(query.dtype, key.dtype, value.dtype), depth=query.shape[-1],
                           value_table=rel_value is not None, dropout=dropout, q_len=query.shape[1],
                           kv_len=key.shape[1])
  return None if need is None else need[1]


def attention_with_bias(query: jax.Array, key: jax.Array, value: jax.Array,
                        rel_key: jax.Array | None, distances: distances_lib.Distances | None,
                        max_distance: int, bias: jax.Array | None, mask: jax.Array | None,
                        implementation: str) -> jax.Array:
  """`bias_attention` on validated inputs, with `distances` from `distances_lib.distances_of`."""
  if rel_key is not None:
    scaled = distances_lib.heads_first(query) * query.shape[-1]**-0.5
    relative = distances_lib.relative_logits(scaled, rel_key, distances, max_distance)
    bias = relative if bias is None else relative + bias
  if mask is not None:
    mask = jnp.asarray(mask, bool)
    if implementation == "cudnn":
      mask = distances_lib.without_empty_rows(mask)
  return jax.nn.dot_product_attention(
      query, key, value, bias=None if bias is None else _as_4d(bias).astype(query.dtype),
      mask=_as_4d(mask), implementation=implementation)


def bias_attention(query: jax.Array, key: jax.Array, value: jax.Array, *,
                   rel_key: jax.Array | None = None, max_distance: int = 0,
                   bias: jax.Array | None = None, mask: jax.Array | None = None,
                   query_positions: jax.Array | None = None, key_positions: jax.Array | None = None,
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
                             key_positions, bias, mask)
  distances = None if rel_key is None else distances_lib.distances_of(
      query_positions, key_positions, mask, query.shape[1], key.shape[1], max_distance)
  return attention_with_bias(query, key, value, rel_key, distances, max_distance, bias, mask,
                             implementation)
