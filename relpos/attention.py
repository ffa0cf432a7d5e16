"""Attention with relative position representations (Shaw et al. 2018) and the NNX module.

The functional core follows the design contract:

  distance(i, j) = clip(key_positions[j] - query_positions[i], -k, k)
  logits[i, j]   = query_i . (key_j + rel_key[distance(i, j) + k]) / sqrt(depth) + bias[i, j]
  weights        = softmax_j(logits masked by `mask`)
  out_i          = sum_j weights[i, j] (value_j + rel_value[distance(i, j) + k])

in its efficient form: the a^K term is q . rel_key^T against the 2k+1 table rows
([batch, heads, q_len, 2k+1]) followed by a gather by clipped distance; the a^V term sums the
attention weights per clipped distance (the transpose of that gather, a scatter-add into
[batch, heads, q_len, 2k+1]) and multiplies the sums by rel_value. No [q_len, kv_len, depth]
tensor is built.

`MultiHeadAttention` selects the position variant ('none', 'absolute', 'relative', 't5', 'rope',
'alibi') and supports an explicit decode cache.
"""
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from relpos import positions as positions_lib

POSITIONS = ("none", "absolute", "relative", "t5", "rope", "alibi")

Cache = dict[str, jax.Array]


def _as_positions(positions: jax.Array | None, length: int, name: str) -> jax.Array:
  """Returns int32 positions [batch or 1, length] (arange when `positions` is None)."""
  if positions is None:
    return jnp.arange(length, dtype=jnp.int32)[None]
  positions = jnp.asarray(positions, jnp.int32)
  if positions.ndim == 1:
    positions = positions[None]
  if positions.ndim != 2 or positions.shape[-1] != length:
    raise ValueError(f"{name} must have shape [{length}] or [batch, {length}], "
                     f"got {positions.shape}.")
  return positions


def _check_table(table: jax.Array | None, name: str, max_distance: int, num_heads: int,
                 depth: int) -> None:
  """Raises ValueError unless `table` is None, [2k+1, depth] or [heads, 2k+1, depth]."""
  if table is None:
    return
  rows = 2 * max_distance + 1
  if tuple(table.shape) not in ((rows, depth), (num_heads, rows, depth)):
    raise ValueError(f"{name} must have shape [{rows}, {depth}] or [{num_heads}, {rows}, {depth}] "
                     f"(2*max_distance+1 rows for max_distance={max_distance}), got {table.shape}.")


def _distance_index(query: jax.Array, key: jax.Array, rel_key: jax.Array | None,
                    rel_value: jax.Array | None, max_distance: int,
                    query_positions: jax.Array | None,
                    key_positions: jax.Array | None) -> jax.Array | None:
  """Validates the inputs; returns the clipped distance index [batch or 1, 1, q_len, kv_len].

  Returns None when neither relative table is given (no index needed).
  """
  if query.ndim != 4 or key.ndim != 4:
    raise ValueError(f"query and key must be [batch, len, heads, depth], got {query.shape} and "
                     f"{key.shape}.")
  if query.shape[0] != key.shape[0] or query.shape[2:] != key.shape[2:]:
    raise ValueError(f"query {query.shape} and key {key.shape} must agree on batch, heads, depth.")
  if max_distance < 0:
    raise ValueError(f"max_distance must be >= 0, got {max_distance}.")
  _, q_len, num_heads, depth = query.shape
  kv_len = key.shape[1]
  _check_table(rel_key, "rel_key", max_distance, num_heads, depth)
  _check_table(rel_value, "rel_value", max_distance, num_heads, depth)
  query_positions = _as_positions(query_positions, q_len, "query_positions")
  key_positions = _as_positions(key_positions, kv_len, "key_positions")
  if rel_key is None and rel_value is None:
    return None
  index = positions_lib.clipped_relative_position_index(query_positions, key_positions,
                                                        max_distance)
  return index[:, None]


def _gather_by_distance(per_distance: jax.Array, index: jax.Array) -> jax.Array:
  """Picks per_distance[b, h, i, index[b, 0, i, j]].

  Args:
    per_distance: [batch, heads, q_len, 2k+1].
    index: int32 [batch or 1, 1, q_len, kv_len] in [0, 2k].

  Returns:
    [batch, heads, q_len, kv_len].
  """
  return jnp.take_along_axis(per_distance, index, axis=-1, mode="promise_in_bounds",
                             wrap_negative_indices=False)


def _sum_by_distance(weights: jax.Array, index: jax.Array, num_distances: int) -> jax.Array:
  """Sums weights[b, h, i, j] into bucket index[b, 0, i, j]: the transpose of the gather.

  Args:
    weights: [batch, heads, q_len, kv_len].
    index: int32 [batch or 1, 1, q_len, kv_len] in [0, num_distances).
    num_distances: 2k+1.

  Returns:
    [batch, heads, q_len, num_distances] (a scatter-add; its gradient is the gather).
  """
  shape = jax.ShapeDtypeStruct(weights.shape[:-1] + (num_distances,), weights.dtype)
  (sums,) = jax.linear_transpose(lambda table: _gather_by_distance(table, index), shape)(weights)
  return sums


def _table_einsum(lhs: str, table: jax.Array, out: str) -> str:
  """Einsum spec contracting with a shared [r, d] or per-head [h, r, d] table."""
  return f"{lhs},{'rd' if table.ndim == 2 else 'hrd'}->{out}"


def _weights(query: jax.Array, key: jax.Array, rel_key: jax.Array | None,
             index: jax.Array | None, bias: jax.Array | None,
             mask: jax.Array | None) -> jax.Array:
  """Attention weights [batch, heads, q_len, kv_len] in float32 (inputs already validated)."""
  query = query * query.shape[-1] ** -0.5
  logits = jnp.einsum("bqhd,bkhd->bhqk", query, key)
  if rel_key is not None:
    per_distance = jnp.einsum(_table_einsum("bqhd", rel_key, "bhqr"), query,
                              rel_key.astype(query.dtype))
    logits = logits + _gather_by_distance(per_distance, index)
  logits = logits.astype(jnp.float32)
  if bias is not None:
    logits = logits + bias
  if mask is not None:
    logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
  return jax.nn.softmax(logits, axis=-1)


def relative_attention_weights(query: jax.Array, key: jax.Array, *,
                               rel_key: jax.Array | None = None, max_distance: int = 0,
                               bias: jax.Array | None = None, mask: jax.Array | None = None,
                               query_positions: jax.Array | None = None,
                               key_positions: jax.Array | None = None) -> jax.Array:
  """The attention weights of `relative_dot_product_attention` (for tests and plots).

  Args:
    query: [batch, q_len, heads, depth].
    key: [batch, kv_len, heads, depth].
    rel_key: None, [2k+1, depth] or [heads, 2k+1, depth]; row r is clipped distance r - k.
    max_distance: the clipping distance k >= 0.
    bias: None or float, broadcastable to [batch, heads, q_len, kv_len], added to the logits.
    mask: None or bool broadcastable to [batch, heads, q_len, kv_len]; True = may attend.
    query_positions: None (0..q_len-1), [q_len] or [batch, q_len] integer positions.
    key_positions: None (0..kv_len-1), [kv_len] or [batch, kv_len] integer positions.

  Returns:
    float32 [batch, heads, q_len, kv_len], rows summing to 1.
  """
  index = _distance_index(query, key, rel_key, None, max_distance, query_positions,
                          key_positions)
  return _weights(query, key, rel_key, index, bias, mask)


def relative_dot_product_attention(query: jax.Array, key: jax.Array, value: jax.Array, *,
                                   rel_key: jax.Array | None = None,
                                   rel_value: jax.Array | None = None, max_distance: int = 0,
                                   bias: jax.Array | None = None, mask: jax.Array | None = None,
                                   query_positions: jax.Array | None = None,
                                   key_positions: jax.Array | None = None,
                                   dropout_rate: float = 0.0,
                                   dropout_rng: jax.Array | None = None) -> jax.Array:
  """Dot-product attention with relative position representations (Shaw et al. 2018).

  Args:
    query: [batch, q_len, heads, depth].
    key: [batch, kv_len, heads, depth].
    value: [batch, kv_len, heads, depth].
    rel_key: None, [2k+1, depth] (shared across heads) or [heads, 2k+1, depth]: a^K, where
      row r holds the vector for clipped distance r - k.
    rel_value: the same for a^V.
    max_distance: the clipping distance k >= 0 (k = 0: one vector for every distance).
    bias: None or float, broadcastable to [batch, heads, q_len, kv_len], added to the logits
      (T5, ALiBi, ...).
    mask: None or bool broadcastable to [batch, heads, q_len, kv_len]; True = may attend.
    query_positions: None (0..q_len-1), [q_len] or [batch, q_len] integer positions.
    key_positions: None (0..kv_len-1), [kv_len] or [batch, kv_len] integer positions.
    dropout_rate: attention-weight dropout rate in [0, 1); applied only with a dropout_rng.
    dropout_rng: PRNG key for attention dropout, or None (no dropout).

  Returns:
    [batch, q_len, heads, depth] in value's dtype.

  Raises:
    ValueError: on inconsistent shapes, a negative max_distance or a bad dropout_rate.
  """
  if value.shape != key.shape:
    raise ValueError(f"value {value.shape} must have the shape of key {key.shape}.")
  if not 0.0 <= dropout_rate < 1.0:
    raise ValueError(f"dropout_rate must be in [0, 1), got {dropout_rate}.")
  index = _distance_index(query, key, rel_key, rel_value, max_distance, query_positions,
                          key_positions)
  weights = _weights(query, key, rel_key, index, bias, mask)
  if dropout_rate > 0.0 and dropout_rng is not None:
    keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, weights.shape)
    weights = jnp.where(keep, weights / (1.0 - dropout_rate), 0.0)
  out = jnp.einsum("bhqk,bkhd->bqhd", weights.astype(value.dtype), value)
  if rel_value is not None:
    # Summed in float32: an edge bucket collects up to kv_len - k weights.
    per_distance = _sum_by_distance(weights, index, rel_value.shape[-2]).astype(value.dtype)
    out = out + jnp.einsum(_table_einsum("bhqr", rel_value, "bqhd"), per_distance,
                           rel_value.astype(value.dtype))
  return out


class RelativePositionTables(nnx.Module):
  """The learned Shaw et al. tables a^K and a^V, (2k+1) rows each.

  One instance may be shared by several attention layers (NNX shared references).

  Attributes:
    max_distance: the clipping distance k.
    depth: the per-head depth of each row.
    num_heads: None (tables shared across heads) or the number of heads (one table per head).
    rel_key: nnx.Param [2k+1, depth] or [heads, 2k+1, depth], or None when a^K is off.
    rel_value: the same for a^V.
  """

  def __init__(self, max_distance: int, depth: int, *, num_heads: int | None = None,
               use_key: bool = True, use_value: bool = True, rngs: nnx.Rngs):
    if not isinstance(max_distance, int) or max_distance < 0:
      raise ValueError(f"max_distance must be an integer >= 0, got {max_distance!r}.")
    if depth < 1:
      raise ValueError(f"depth must be >= 1, got {depth}.")
    if num_heads is not None and num_heads < 1:
      raise ValueError(f"num_heads must be None (shared) or >= 1, got {num_heads}.")
    if not (use_key or use_value):
      raise ValueError("use_key and use_value are both False: relative attention needs a^K or "
                       "a^V (use position 'none' for neither).")
    self.max_distance = max_distance
    self.depth = depth
    self.num_heads = num_heads
    shape = (2 * max_distance + 1, depth)
    if num_heads is not None:
      shape = (num_heads, *shape)
    init = nnx.initializers.normal(stddev=depth ** -0.5)
    self.rel_key = nnx.Param(init(rngs.params(), shape)) if use_key else None
    self.rel_value = nnx.Param(init(rngs.params(), shape)) if use_value else None


class T5RelativeBias(nnx.Module):
  """T5 relative attention bias: one learned scalar per head per logarithmic bucket.

  Attributes:
    num_heads, num_buckets, max_distance, bidirectional: as in `t5_relative_position_bucket`.
    embedding: nnx.Param [num_buckets, num_heads].
  """

  def __init__(self, num_heads: int, *, num_buckets: int = 32, max_distance: int = 128,
               bidirectional: bool, rngs: nnx.Rngs):
    if num_heads < 1:
      raise ValueError(f"num_heads must be >= 1, got {num_heads}.")
    # Validates num_buckets / max_distance with the same rules as the bucket function.
    positions_lib.t5_relative_position_bucket(0, bidirectional=bidirectional,
                                              num_buckets=num_buckets, max_distance=max_distance)
    self.num_heads = num_heads
    self.num_buckets = num_buckets
    self.max_distance = max_distance
    self.bidirectional = bidirectional
    init = nnx.initializers.normal(stddev=0.02)
    self.embedding = nnx.Param(init(rngs.params(), (num_buckets, num_heads)))

  def __call__(self, query_positions: jax.Array, key_positions: jax.Array) -> jax.Array:
    """Bias for every (query, key) pair.

    Args:
      query_positions: integer [batch, q_len].
      key_positions: integer [batch, kv_len].

    Returns:
      float32 [batch, heads, q_len, kv_len].
    """
    buckets = positions_lib.t5_relative_position_bucket(
        positions_lib.relative_positions(query_positions, key_positions),
        bidirectional=self.bidirectional, num_buckets=self.num_buckets,
        max_distance=self.max_distance)
    return jnp.moveaxis(self.embedding[...][buckets], -1, -3)


class MultiHeadAttention(nnx.Module):
  """Multi-head attention whose position variant is chosen by `position`.

  'none' and 'absolute' add nothing inside attention; 'relative' uses the Shaw et al. tables of
  `relative_tables`; 't5' adds the bias of `t5_bias`; 'rope' rotates queries and keys; 'alibi'
  adds -slope * |j - i| per head (causality comes from the mask). Cross-attention is built with
  position='none'.
  """

  def __init__(self, num_heads: int, model_dim: int, *, qkv_dim: int, position: str = "none",
               relative_tables: RelativePositionTables | None = None,
               t5_bias: T5RelativeBias | None = None, rope_base: float = 10000.0,
               dropout_rate: float = 0.0, rngs: nnx.Rngs):
    if position not in POSITIONS:
      raise ValueError(f"position must be one of {POSITIONS}, got {position!r}.")
    if num_heads < 1 or qkv_dim % num_heads:
      raise ValueError(f"num_heads={num_heads} must be >= 1 and divide qkv_dim={qkv_dim}.")
    if not 0.0 <= dropout_rate < 1.0:
      raise ValueError(f"dropout_rate must be in [0, 1), got {dropout_rate}.")
    head_dim = qkv_dim // num_heads
    if (relative_tables is not None) != (position == "relative"):
      raise ValueError(f"relative_tables must be given exactly when position='relative' "
                       f"(position={position!r}).")
    if relative_tables is not None and (
        relative_tables.depth != head_dim or relative_tables.num_heads not in (None, num_heads)):
      raise ValueError(f"relative_tables (depth={relative_tables.depth}, "
                       f"num_heads={relative_tables.num_heads}) must have depth {head_dim} "
                       f"(qkv_dim / num_heads) and num_heads None or {num_heads}.")
    if (t5_bias is not None) != (position == "t5"):
      raise ValueError(f"t5_bias must be given exactly when position='t5' "
                       f"(position={position!r}).")
    if t5_bias is not None and t5_bias.num_heads != num_heads:
      raise ValueError(f"t5_bias.num_heads={t5_bias.num_heads} must equal num_heads={num_heads}.")
    if position == "rope" and head_dim % 2:
      raise ValueError(f"position='rope' needs an even head dim, got qkv_dim/num_heads={head_dim}.")
    self.num_heads = num_heads
    self.head_dim = head_dim
    self.position = position
    self.relative_tables = relative_tables
    self.t5_bias = t5_bias
    self.rope_base = rope_base
    self.dropout_rate = dropout_rate
    self.dropout_rngs = rngs.dropout.fork() if dropout_rate > 0.0 else None

    def projection(in_features: Any, out_features: Any, axis: Any) -> nnx.LinearGeneral:
      return nnx.LinearGeneral(in_features, out_features, axis=axis, use_bias=False,
                               kernel_init=nnx.initializers.xavier_uniform(), rngs=rngs)

    self.query = projection(model_dim, (num_heads, head_dim), -1)
    self.key = projection(model_dim, (num_heads, head_dim), -1)
    self.value = projection(model_dim, (num_heads, head_dim), -1)
    self.out = projection((num_heads, head_dim), model_dim, (-2, -1))

  def init_cache(self, batch_size: int, max_len: int, dtype: Any = jnp.float32) -> Cache:
    """A zero decode cache {'key', 'value'}: each [batch_size, max_len, heads, head_dim]."""
    shape = (batch_size, max_len, self.num_heads, self.head_dim)
    return {"key": jnp.zeros(shape, dtype), "value": jnp.zeros(shape, dtype)}

  def _project(self, inputs_q: jax.Array, inputs_kv: jax.Array, query_positions: jax.Array,
               key_positions: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Query, key, value [batch, len, heads, head_dim]; RoPE applied when position='rope'."""
    query, key, value = self.query(inputs_q), self.key(inputs_kv), self.value(inputs_kv)
    if self.position == "rope":
      query = positions_lib.apply_rope(query, query_positions, self.rope_base)
      key = positions_lib.apply_rope(key, key_positions, self.rope_base)
    return query, key, value

  def _position_terms(self, query_positions: jax.Array,
                      key_positions: jax.Array) -> dict[str, Any]:
    """Keyword arguments of `relative_dot_product_attention` carrying the position terms."""
    if self.position == "relative":
      tables = self.relative_tables
      return {"rel_key": None if tables.rel_key is None else tables.rel_key[...],
              "rel_value": None if tables.rel_value is None else tables.rel_value[...],
              "max_distance": tables.max_distance, "query_positions": query_positions,
              "key_positions": key_positions}
    if self.position == "t5":
      return {"bias": self.t5_bias(query_positions, key_positions)}
    if self.position == "alibi":
      slopes = positions_lib.alibi_slopes(self.num_heads)
      return {"bias": positions_lib.alibi_bias(query_positions, key_positions, slopes)}
    return {}

  def _positions(self, inputs_q: jax.Array, inputs_kv: jax.Array | None,
                 query_positions: jax.Array | None,
                 key_positions: jax.Array | None) -> tuple[jax.Array, jax.Array]:
    """[batch or 1, len] positions; self-attention keys default to the query positions."""
    query_positions = _as_positions(query_positions, inputs_q.shape[1], "query_positions")
    if inputs_kv is None and key_positions is None:
      return query_positions, query_positions
    kv_len = (inputs_q if inputs_kv is None else inputs_kv).shape[1]
    return query_positions, _as_positions(key_positions, kv_len, "key_positions")

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
    return relative_attention_weights(query, key, mask=mask, **terms)

  def __call__(self, inputs_q: jax.Array, inputs_kv: jax.Array | None = None, *,
               mask: jax.Array | None = None, query_positions: jax.Array | None = None,
               key_positions: jax.Array | None = None, deterministic: bool = True,
               cache: Cache | None = None,
               cache_index: jax.Array | int | None = None) -> jax.Array | tuple[jax.Array, Cache]:
    """Attends from inputs_q to inputs_kv (or to itself).

    Args:
      inputs_q: [batch, q_len, model_dim]; [batch, 1, model_dim] when decoding with a cache.
      inputs_kv: [batch, kv_len, model_dim], or None for self-attention.
      mask: None or bool broadcastable to [batch, heads, q_len, kv_len]; True = may attend.
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
    out = relative_dot_product_attention(
        query, key, value, mask=mask, dropout_rate=self.dropout_rate,
        dropout_rng=self.dropout_rngs() if dropout else None,
        **self._position_terms(query_positions, key_positions))
    return self.out(out)

  def _decode_step(self, inputs_q: jax.Array, inputs_kv: jax.Array | None,
                   mask: jax.Array | None, query_positions: jax.Array | None,
                   key_positions: jax.Array | None, deterministic: bool, cache: Cache,
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
    cache = {"key": jax.lax.dynamic_update_slice(cache["key"], key.astype(cache["key"].dtype),
                                                 start),
             "value": jax.lax.dynamic_update_slice(cache["value"],
                                                   value.astype(cache["value"].dtype), start)}
    visible = (key_positions <= cache_index)[:, None, None, :]
    mask = visible if mask is None else jnp.logical_and(mask, visible)
    out = self._attend(query, cache["key"], cache["value"], mask, query_positions, key_positions,
                       deterministic)
    return out, cache
