"""The multi-head attention layer: projections, a position variant's terms, the kernel, the
decode cache.

The layer never names a variant: a self-attention layer is handed one
`relpos.variants.AttentionPosition` (or None: cross-attention, and variants that act only on
the embeddings), which may transform the projected queries and keys and adds its
`AttentionTerms` (bias, a^K / a^V tables) to the kernel call
(`relpos.kernels.relative.relative_dot_product_attention`).
"""
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from relpos import positions as positions_lib
from relpos.kernels import relative as kernel
from relpos.variants import interface as variants

Cache = dict[str, jax.Array]
# The Shaw et al. core under its public name (a contract of the design: importable from here
# wherever the kernel lives).
relative_dot_product_attention = kernel.relative_dot_product_attention


class MultiHeadAttention(nnx.Module):
  """Multi-head attention whose position information comes from `position`.

  `position` is a variant's `AttentionPosition` for this layer (possibly shared with other
  layers), or None: no position term (cross-attention, and variants that act only on the
  embeddings).

  Parameters are float32; `dtype` is the compute dtype of the projections, the attention
  inputs and the decode cache (the logits and softmax stay float32). `implementation` chooses
  the kernel ('auto', 'xla', 'cudnn'; see `relpos.kernels.relative`).
  """
  def __init__(self, num_heads: int, model_dim: int, *, qkv_dim: int,
               position: variants.AttentionPosition | None = None, dropout_rate: float = 0.0,
               dtype: Any = jnp.float32, implementation: str = "auto", rngs: nnx.Rngs):
    if num_heads < 1 or qkv_dim % num_heads:
      raise ValueError(f"num_heads={num_heads} must be >= 1 and divide qkv_dim={qkv_dim}.")
    if not 0.0 <= dropout_rate < 1.0:
      raise ValueError(f"dropout_rate must be in [0, 1), got {dropout_rate}.")
    if position is not None and not isinstance(position, variants.AttentionPosition):
      raise ValueError(f"position must be a relpos.variants.AttentionPosition or None, got "
                       f"{position!r}.")
    if implementation not in kernel.IMPLEMENTATIONS:
      raise ValueError(f"implementation must be one of {kernel.IMPLEMENTATIONS}, got "
                       f"{implementation!r}.")
    head_dim = qkv_dim // num_heads
    if position is not None:
      position.check_layer(num_heads, head_dim)
    self.num_heads = num_heads
    self.head_dim = head_dim
    self.position = position
    self.dropout_rate = dropout_rate
    self.dtype = dtype
    self.implementation = implementation
    self.dropout_rngs = rngs.dropout.fork() if dropout_rate > 0.0 else None

    def projection(in_features: Any, out_features: Any, axis: Any) -> nnx.LinearGeneral:
      return nnx.LinearGeneral(in_features, out_features, axis=axis, use_bias=False,
                               kernel_init=nnx.initializers.xavier_uniform(), dtype=dtype,
                               param_dtype=jnp.float32, rngs=rngs)

    self.query = projection(model_dim, (num_heads, head_dim), -1)
    self.key = projection(model_dim, (num_heads, head_dim), -1)
    self.value = projection(model_dim, (num_heads, head_dim), -1)
    self.out = projection((num_heads, head_dim), model_dim, (-2, -1))

  def init_cache(self, batch_size: int, max_len: int) -> Cache:
    """A zero decode cache {'key', 'value'}: each [batch_size, max_len, heads, head_dim] in the
    compute dtype."""
    shape = (batch_size, max_len, self.num_heads, self.head_dim)
    return {"key": jnp.zeros(shape, self.dtype), "value": jnp.zeros(shape, self.dtype)}

  def _project(self, inputs_q: jax.Array, inputs_kv: jax.Array, query_positions: jax.Array,
               key_positions: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Query, key, value [batch, len, heads, head_dim], queries and keys transformed by the
    position module."""
    query, key, value = self.query(inputs_q), self.key(inputs_kv), self.value(inputs_kv)
    if self.position is not None:
      query, key = self.position.queries_and_keys(query, key, query_positions, key_positions)
    return query, key, value

  def _position_terms(self, query_positions: jax.Array, key_positions: jax.Array) -> dict[str, Any]:
    """Keyword arguments of the kernel carrying the position terms and positions."""
    terms = (variants.AttentionTerms() if self.position is None else self.position.terms(
        query_positions, key_positions))
    return {
        **terms.kernel_arguments(), "query_positions": query_positions,
        "key_positions": key_positions
    }

  def _positions(self, inputs_q: jax.Array, inputs_kv: jax.Array | None,
                 query_positions: jax.Array | None,
                 key_positions: jax.Array | None) -> tuple[jax.Array, jax.Array]:
    """[batch or 1, len] positions; self-attention keys default to the query positions."""
    query_positions = positions_lib.as_positions(query_positions, inputs_q.shape[1],
                                                 "query_positions")
    if inputs_kv is None and key_positions is None:
      return query_positions, query_positions
    kv_len = (inputs_q if inputs_kv is None else inputs_kv).shape[1]
    return query_positions, positions_lib.as_positions(key_positions, kv_len, "key_positions")

  def attention_weights(self, inputs_q: jax.Array, inputs_kv: jax.Array | None = None, *,
                        mask: jax.Array | None = None, query_positions: jax.Array | None = None,
                        key_positions: jax.Array | None = None) -> jax.Array:
    """The attention weights [batch, heads, q_len, kv_len] (float32) of the full forward."""
    query_positions, key_positions = self._positions(inputs_q, inputs_kv, query_positions,
                                                     key_positions)
    kv = inputs_q if inputs_kv is None else inputs_kv
    query, key, _ = self._project(inputs_q, kv, query_positions, key_positions)
    terms = self._position_terms(query_positions, key_positions)
    terms.pop("rel_value", None)
    return kernel.relative_attention_weights(query, key, mask=mask, **terms)

  def __call__(self, inputs_q: jax.Array, inputs_kv: jax.Array | None = None, *,
               mask: jax.Array | None = None, query_positions: jax.Array | None = None,
               key_positions: jax.Array | None = None, deterministic: bool = True,
               cache: Cache | None = None,
               cache_index: jax.Array | int | None = None) -> jax.Array | tuple[jax.Array, Cache]:
    """Attends from inputs_q to inputs_kv (or to itself).

    Args:
      inputs_q: [batch, q_len, model_dim]; [batch, 1, model_dim] when decoding with a cache.
      inputs_kv: [batch, kv_len, model_dim], or None for self-attention.
      mask: None or bool [q_len, kv_len] or [batch or 1, heads or 1, q_len, kv_len]; True = may
        attend.
        With a cache kv_len is the cache length; keys after cache_index are masked in addition.
      query_positions: None (0..q_len-1) or integer [batch, q_len]. Must be None with a cache.
      key_positions: None or integer [batch, kv_len]; defaults to query_positions for
        self-attention, else 0..kv_len-1. Must be None with a cache.
      deterministic: if False and dropout_rate > 0, drops attention weights.
      cache: None, or the self-attention decode cache of `init_cache`.
      cache_index: int32 scalar, the position of the decoded token (with a cache only).

    Returns:
      [batch, q_len, model_dim]; with a cache, (that output, the updated cache).

    Raises:
      ValueError: on a cache used for cross-attention, with several query tokens, without
        cache_index or together with explicit positions.
    """
    if cache is not None:
      return self._decode_step(inputs_q, inputs_kv, mask, query_positions, key_positions,
                               deterministic, cache, cache_index)
    query_positions, key_positions = self._positions(inputs_q, inputs_kv, query_positions,
                                                     key_positions)
    kv = inputs_q if inputs_kv is None else inputs_kv
    query, key, value = self._project(inputs_q, kv, query_positions, key_positions)
    return self._attend(query, key, value, mask, query_positions, key_positions, deterministic)

  def _attend(self, query: jax.Array, key: jax.Array, value: jax.Array, mask: jax.Array | None,
              query_positions: jax.Array, key_positions: jax.Array,
              deterministic: bool) -> jax.Array:
    """Attention over projected heads followed by the output projection."""
    dropout = not deterministic and self.dropout_rate > 0.0
    out = kernel.relative_dot_product_attention(
        query, key, value, mask=mask, dropout_rate=self.dropout_rate,
        dropout_rng=self.dropout_rngs() if dropout else None, implementation=self.implementation,
        **self._position_terms(query_positions, key_positions))
    return self.out(out)

  def _decode_step(self, inputs_q: jax.Array, inputs_kv: jax.Array | None, mask: jax.Array | None,
                   query_positions: jax.Array | None, key_positions: jax.Array | None,
                   deterministic: bool, cache: Cache,
                   cache_index: jax.Array | int | None) -> tuple[jax.Array, Cache]:
    """One cached self-attention step: the query sits at position cache_index."""
    if inputs_kv is not None:
      raise ValueError("cache is for self-attention only: inputs_kv must be None with a cache.")
    if inputs_q.shape[1] != 1:
      raise ValueError(f"with a cache inputs_q must be [batch, 1, model_dim], "
                       f"got {inputs_q.shape}.")
    if cache_index is None:
      raise ValueError("cache_index is required with a cache.")
    if query_positions is not None or key_positions is not None:
      raise ValueError("query_positions/key_positions must be None with a cache: the query "
                       "position is cache_index and key positions are the cache slots.")
    max_len = cache["key"].shape[1]
    cache_index = jnp.asarray(cache_index, jnp.int32)
    query_positions = jnp.full((1, 1), cache_index, jnp.int32)
    key_positions = jnp.arange(max_len, dtype=jnp.int32)[None]
    query, key, value = self._project(inputs_q, inputs_q, query_positions, query_positions)
    start = (0, cache_index, 0, 0)
    cache = {
        "key": jax.lax.dynamic_update_slice(cache["key"], key.astype(cache["key"].dtype), start),
        "value": jax.lax.dynamic_update_slice(cache["value"], value.astype(cache["value"].dtype),
                                              start)
    }
    visible = (key_positions <= cache_index)[:, None, None, :]
    mask = visible if mask is None else jnp.logical_and(mask, visible)
    out = self._attend(query, cache["key"], cache["value"], mask, query_positions, key_positions,
                       deterministic)
    return out, cache
