"""Attention with relative position representations (Shaw et al. 2018) and the NNX module.

The functional core follows the design contract:

  distance(i, j) = clip(key_positions[j] - query_positions[i], -k, k)
  logits[i, j]   = query_i . (key_j + rel_key[distance(i, j) + k]) / sqrt(depth) + bias[i, j]
  weights        = softmax_j(logits masked by `mask`)
  out_i          = sum_j weights[i, j] (value_j + rel_value[distance(i, j) + k])

in its efficient form: the a^K term is q . rel_key^T against the 2k+1 table rows
([batch, heads, q_len, 2k+1]) followed by a gather by clipped distance; the a^V term sums the
attention weights per clipped distance ([batch, heads, q_len, 2k+1]) and multiplies the sums by
rel_value. No [q_len, kv_len, depth] tensor is built.

Summing per distance (the a^V forward and the a^K backward) is a scatter-add in general, which
is slow on CPU. When every pair the softmax can weigh has distance clip(j - i) (positions
0..n-1, or positions restarting per packed segment whose mask keeps segments apart), the sums are
the band |j - i| < k read along diagonals plus two masked row sums, and rows whose weighed pairs
all share one distance (padding) are a row sum; the gather of the a^V backward likewise reads
one pattern shared by the whole batch instead of a per-pair index. This structure is checked at
run time from the positions and the mask in one pass over the pairs (`_distances`); a `lax.cond`
takes the per-pair gather and scatter-add whenever it does not hold, so results are exact for
arbitrary positions. Without positions no check is needed.

The kernel is chosen explicitly (`implementation`, like maxtext's `attention_kernel`): 'xla' is
the path above; 'cudnn' calls `jax.nn.dot_product_attention` with cuDNN's fused kernel, a^K
gathered into its additive bias (`bias_attention`), and raises a ValueError naming the reason
where cuDNN cannot run the call (not a GPU, float32, a^V, attention dropout, head depth, odd
lengths); 'auto' takes cuDNN exactly where it can run, else XLA. The logits are float32 whatever
the inputs' dtype (the products accumulate in float32), and so is the softmax.

`MultiHeadAttention` selects the position variant ('none', 'absolute', 'relative', 't5', 'rope',
'alibi') and supports an explicit decode cache.
"""
import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from relpos import positions as positions_lib

POSITIONS = ("none", "absolute", "relative", "t5", "rope", "alibi")
IMPLEMENTATIONS = ("auto", "xla", "cudnn")

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


def _check_inputs(query: jax.Array, key: jax.Array, rel_key: jax.Array | None,
                  rel_value: jax.Array | None, max_distance: int,
                  query_positions: jax.Array | None, key_positions: jax.Array | None) -> None:
  """Raises ValueError on inconsistent shapes, tables or positions."""
  if query.ndim != 4 or key.ndim != 4:
    raise ValueError(f"query and key must be [batch, len, heads, depth], got {query.shape} and "
                     f"{key.shape}.")
  if query.shape[0] != key.shape[0] or query.shape[2:] != key.shape[2:]:
    raise ValueError(f"query {query.shape} and key {key.shape} must agree on batch, heads, depth.")
  if max_distance < 0:
    raise ValueError(f"max_distance must be >= 0, got {max_distance}.")
  _, q_len, num_heads, depth = query.shape
  _check_table(rel_key, "rel_key", max_distance, num_heads, depth)
  _check_table(rel_value, "rel_value", max_distance, num_heads, depth)
  _as_positions(query_positions, q_len, "query_positions")
  _as_positions(key_positions, key.shape[1], "key_positions")


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["query_positions", "key_positions", "structured", "constant_row",
                                "constant_index"],
                   meta_fields=["q_len", "kv_len"])
@dataclasses.dataclass(frozen=True)
class _Distances:
  """Which clipped distance index each (query, key) pair has, and how to gather and sum by it.

  Without positions every pair's index is clip(j - i, -k, k) + k (`_sequential_index`), a pattern
  shared by the whole batch. With positions the index is computed from them, and a run-time check
  says whether the shared pattern still serves: `structured` is True when every row is sequential
  (its index is clip(j - i) + k on every pair its softmax can weigh) or constant on those pairs
  (padding rows of packed batches). Sums then use the shared pattern with a per-row fix for
  constant rows; otherwise the per-pair index (a scatter-add).

  The lengths are static fields, so the shared pattern is built from them where it is read
  rather than carried as a [q_len, kv_len] array through the custom VJPs' residuals.

  Attributes:
    q_len, kv_len: the query and key lengths (static).
    query_positions: None, or int32 [batch or 1, q_len].
    key_positions: None, or int32 [batch or 1, kv_len].
    structured: None without positions; else a bool scalar (see above).
    constant_row: None, or bool [batch or 1, 1, q_len, 1]: the rows taken as constant.
    constant_index: None, or int32 [batch or 1, 1, q_len, 1]: their one index.
  """
  q_len: int
  kv_len: int
  query_positions: jax.Array | None = None
  key_positions: jax.Array | None = None
  structured: jax.Array | None = None
  constant_row: jax.Array | None = None
  constant_index: jax.Array | None = None


def _sequential_index(distances: _Distances, max_distance: int) -> jax.Array:
  """int32 [1, 1, q_len, kv_len]: clip(j - i, -k, k) + k."""
  return positions_lib.clipped_relative_position_index(
      jnp.arange(distances.q_len, dtype=jnp.int32), jnp.arange(distances.kv_len, dtype=jnp.int32),
      max_distance)[None, None]


def _pair_index(distances: _Distances, max_distance: int) -> jax.Array:
  """int32 [batch or 1, 1, q_len, kv_len]: each pair's index from the explicit positions."""
  return positions_lib.clipped_relative_position_index(
      distances.query_positions, distances.key_positions, max_distance)[:, None]


def _pairs_weighed(mask: jax.Array | None, q_len: int, kv_len: int) -> jax.Array | None:
  """bool [batch or 1, 1, q_len, kv_len]: pairs the softmax can weigh in some head (None: all).

  A row that a head masks completely gets uniform weights over all its keys, so it counts whole.
  """
  if mask is None:
    return None
  mask = jnp.asarray(mask, bool)
  mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
  mask = mask | ~jnp.any(mask, axis=-1, keepdims=True)
  weighed = jnp.any(mask, axis=1, keepdims=True)
  return jnp.broadcast_to(weighed, weighed.shape[:2] + (q_len, kv_len))


def _distances(query_positions: jax.Array | None, key_positions: jax.Array | None,
               mask: jax.Array | None, q_len: int, kv_len: int, max_distance: int) -> _Distances:
  """The positions and the run-time check of the structure the shared pattern exploits."""
  if query_positions is None and key_positions is None:
    return _Distances(q_len, kv_len)
  distances = _Distances(q_len, kv_len, _as_positions(query_positions, q_len, "query_positions"),
                         _as_positions(key_positions, kv_len, "key_positions"))
  index = _pair_index(distances, max_distance)
  weighed = _pairs_weighed(mask, q_len, kv_len)
  if weighed is None:
    weighed = jnp.ones((1, 1, q_len, kv_len), bool)
  sequential = ~weighed | (index == _sequential_index(distances, max_distance))
  # One pass over the pairs: is every weighed pair sequential, and the highest and lowest index.
  is_sequential, high, low = jax.lax.reduce(
      (sequential, jnp.where(weighed, index, -1), jnp.where(weighed, index, 2 * max_distance + 1)),
      (jnp.array(True), jnp.array(-1, jnp.int32), jnp.array(2 * max_distance + 1, jnp.int32)),
      lambda x, y: (x[0] & y[0], jnp.maximum(x[1], y[1]), jnp.minimum(x[2], y[2])), (3,))
  is_sequential, high, low = is_sequential[..., None], high[..., None], low[..., None]
  return dataclasses.replace(distances, structured=jnp.all(is_sequential | (high == low)),
                             constant_row=~is_sequential,
                             constant_index=jnp.clip(high, 0, 2 * max_distance))


def _sequential_sum(values: jax.Array, max_distance: int, constant_row: jax.Array | None = None,
                    constant_index: jax.Array | None = None) -> jax.Array:
  """Sums values[..., i, j] per clip(j - i, -k, k) + k, without a scatter.

  Args:
    values: [batch, heads, q_len, kv_len].
    max_distance: k.
    constant_row: None, or bool [batch or 1, 1, q_len, 1]: rows whose whole sum goes to the one
      index `constant_index` [batch or 1, 1, q_len, 1] instead.

  Returns:
    [batch, heads, q_len, 2k+1]: columns 1..2k-1 are the diagonals j = i + r - k (0 outside
    the matrix), column 0 sums j - i <= -k and column 2k sums j - i >= k.
  """
  if max_distance == 0:
    return jnp.sum(values, axis=-1, keepdims=True)
  q_len, kv_len = values.shape[-2:]
  offset = jnp.arange(kv_len)[None, :] - jnp.arange(q_len)[:, None]
  zero = jnp.zeros((), values.dtype)
  # One variadic reduction reads `values` once for both edges (and constant rows' totals).
  operands = [jnp.where(offset <= -max_distance, values, zero),
              jnp.where(offset >= max_distance, values, zero)]
  if constant_row is not None:
    operands.append(values)
  edges = jax.lax.reduce(tuple(operands), (zero,) * len(operands),
                         lambda x, y: tuple(a + b for a, b in zip(x, y)), (values.ndim - 1,))
  before, after = edges[0][..., None], edges[1][..., None]
  columns = jnp.arange(q_len)[:, None] + jnp.arange(-max_distance, max_distance + 1)[None, :]
  inside = (columns >= 0) & (columns < kv_len)
  diagonals = jnp.take_along_axis(values, jnp.clip(columns, 0, kv_len - 1)[None, None], axis=-1,
                                  mode="promise_in_bounds", wrap_negative_indices=False)
  index = jnp.arange(2 * max_distance + 1)
  sums = jnp.where(index == 0, before,
                   jnp.where(index == 2 * max_distance, after, jnp.where(inside, diagonals, 0)))
  if constant_row is None:
    return sums
  return jnp.where(constant_row, jnp.where(index == constant_index, edges[2][..., None], 0), sums)


def _scatter_sum(values: jax.Array, index: jax.Array, num_distances: int) -> jax.Array:
  """Sums values[b, h, i, j] into bucket index[b, 0, i, j]: the transpose of the gather."""
  shape = jax.ShapeDtypeStruct(values.shape[:-1] + (num_distances,), values.dtype)
  gather = functools.partial(_take, index=index)
  (sums,) = jax.linear_transpose(gather, shape)(values)
  return sums


def _take(per_distance: jax.Array, index: jax.Array) -> jax.Array:
  """per_distance[b, h, i, index[b, 0, i, j]]: [batch, heads, q_len, index.shape[-1]]."""
  return jnp.take_along_axis(per_distance, index, axis=-1, mode="promise_in_bounds",
                             wrap_negative_indices=False)


def _sum_by_distance(values: jax.Array, distances: _Distances, max_distance: int) -> jax.Array:
  """Sums values [batch, heads, q_len, kv_len] per distance index -> [..., q_len, 2k+1].

  Exact for arbitrary positions provided `values` vanish on the pairs `distances` was checked
  without (softmax weights, and the logits' cotangents, are 0 where the mask removes a pair).
  """
  if distances.structured is None:
    return _sequential_sum(values, max_distance)
  num_distances = 2 * max_distance + 1

  def structured(values: jax.Array) -> jax.Array:
    return _sequential_sum(values, max_distance, distances.constant_row, distances.constant_index)

  def per_pair(values: jax.Array) -> jax.Array:
    return _scatter_sum(values, _pair_index(distances, max_distance), num_distances)

  return jax.lax.cond(distances.structured, structured, per_pair, values)


def _take_by_distance(per_distance: jax.Array, distances: _Distances,
                      max_distance: int) -> jax.Array:
  """per_distance [batch, heads, q_len, 2k+1] read at each pair's index: [..., q_len, kv_len].

  A gather that fuses into its consumer (the logits): the shared pattern without positions, else
  the per-pair index.
  """
  if distances.structured is None:
    return _take(per_distance, _sequential_index(distances, max_distance))
  return _take(per_distance, _pair_index(distances, max_distance))


def _take_weighed_by_distance(per_distance: jax.Array, distances: _Distances,
                              max_distance: int) -> jax.Array:
  """`_take_by_distance` on the pairs the softmax can weigh (elsewhere the values may differ).

  Reads the shared pattern, with constant rows fixed per row, when the structure holds. The
  `lax.cond` choosing it gives its result a buffer of its own, so this is for gathers that are
  materialized anyway (on a fused gather the buffer would cost a [batch, heads, q_len, kv_len]
  array: 1.4x plain attention's temporary memory instead of 1.12x at n = 1024, k = 64).
  """
  if distances.structured is None:
    return _take(per_distance, _sequential_index(distances, max_distance))

  def structured(per_distance: jax.Array) -> jax.Array:
    constant = _take(per_distance, distances.constant_index)
    return jnp.where(distances.constant_row, constant,
                     _take(per_distance, _sequential_index(distances, max_distance)))

  return jax.lax.cond(distances.structured, structured,
                      functools.partial(_take_by_distance, distances=distances,
                                        max_distance=max_distance), per_distance)


def _table_einsum(lhs: str, table: jax.Array, out: str) -> str:
  """Einsum spec contracting with a shared [r, d] or per-head [h, r, d] table."""
  return f"{lhs},{'rd' if table.ndim == 2 else 'hrd'}->{out}"


def _heads_first(x: jax.Array) -> jax.Array:
  """[batch, len, heads, depth] -> [batch, heads, len, depth] (the layout of the matmuls)."""
  return jnp.swapaxes(x, 1, 2)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _gather_by_distance(per_distance: jax.Array, distances: _Distances,
                        max_distance: int) -> jax.Array:
  """`_take_by_distance` whose gradient is `_sum_by_distance` (valid because the logits'
  cotangent vanishes off the pairs the mask keeps)."""
  return _take_by_distance(per_distance, distances, max_distance)


def _gather_fwd(per_distance, distances, max_distance):
  return _gather_by_distance(per_distance, distances, max_distance), distances


def _gather_bwd(max_distance, distances, cotangent):
  return _sum_by_distance(cotangent, distances, max_distance), None


_gather_by_distance.defvjp(_gather_fwd, _gather_bwd)


def _relative_logits(query: jax.Array, rel_key: jax.Array, distances: _Distances,
                     max_distance: int) -> jax.Array:
  """a^K term query_i . rel_key[distance(i, j)]: [b, h, q_len, kv_len].

  Args:
    query: pre-scaled, heads first [batch, heads, q_len, depth].
  """
  # [b, h, q, d] x [(h,) 2k+1, d] -> [b, h, q, 2k+1], accumulated in float32
  per_distance = jnp.einsum(_table_einsum("bhqd", rel_key, "bhqr"), query,
                            rel_key.astype(query.dtype), preferred_element_type=jnp.float32)
  return _gather_by_distance(per_distance, distances, max_distance)


def _logits(query: jax.Array, key: jax.Array, rel_key: jax.Array | None,
            distances: _Distances | None, max_distance: int, bias: jax.Array | None,
            mask: jax.Array | None) -> jax.Array:
  """Masked float32 logits [batch, heads, q_len, kv_len] (inputs already validated).

  The products accumulate in float32 whatever the inputs' dtype (bfloat16 logits would round
  each to 8 bits of mantissa before the softmax).

  Args:
    query, key: heads first, [batch, heads, len, depth].
  """
  query = query * query.shape[-1] ** -0.5
  # [b, h, q, d] x [b, h, k, d] -> [b, h, q, k], accumulated in float32
  logits = jnp.einsum("bhqd,bhkd->bhqk", query, key, preferred_element_type=jnp.float32)
  if rel_key is not None:
    logits = logits + _relative_logits(query, rel_key, distances, max_distance)
  if bias is not None:
    logits = logits + bias
  if mask is not None:
    logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
  return logits


def _dropped(weights: jax.Array, keep: jax.Array | None, dropout_rate: float) -> jax.Array:
  """Attention dropout: weights / (1 - rate) where `keep`, else 0 (identity when keep is None)."""
  if keep is None:
    return weights
  return jnp.where(keep, weights / (1.0 - dropout_rate), 0.0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _attend_with_relative_values(logits: jax.Array, keep: jax.Array | None, value: jax.Array,
                                 rel_value: jax.Array, distances: _Distances, max_distance: int,
                                 dropout_rate: float) -> jax.Array:
  """softmax(logits) applied to value_j + rel_value[distance(i, j)].

  The a^V term is sum_r sums[i, r] rel_value[r] with sums the (dropped) weights summed per
  distance. The gradient is written out so that the logits' cotangent is one dot-product pass
  plus one elementwise pass that reads the a^V cotangent per distance where it is needed,
  instead of materializing a gathered [batch, heads, q_len, kv_len] cotangent of the weights.

  Args:
    logits: masked float32 logits [batch, heads, q_len, kv_len].
    keep: None, or the bool dropout mask of the weights.
    value: heads first, [batch, heads, kv_len, depth].
    rel_value: [2k+1, depth] or [heads, 2k+1, depth], in value's dtype.
    distances: from `_distances`.
    max_distance: k.
    dropout_rate: the rate `keep` was drawn with.

  Returns:
    [batch, heads, q_len, depth].
  """
  return _attend_with_relative_values_fwd(logits, keep, value, rel_value, distances,
                                          max_distance, dropout_rate)[0]


def _attend_with_relative_values_fwd(logits, keep, value, rel_value, distances, max_distance,
                                     dropout_rate):
  weights = jax.nn.softmax(logits, axis=-1)
  dropped = _dropped(weights, keep, dropout_rate)
  # Summed in float32: an edge bucket collects up to kv_len - k weights.
  sums = _sum_by_distance(dropped, distances, max_distance)
  out = (jnp.einsum("bhqk,bhkd->bhqd", dropped.astype(value.dtype), value)
         + jnp.einsum(_table_einsum("bhqr", rel_value, "bhqd"), sums.astype(value.dtype),
                      rel_value))
  return out, (weights, keep, value, rel_value, distances, sums)


def _attend_with_relative_values_bwd(max_distance, dropout_rate, residuals, cotangent):
  weights, keep, value, rel_value, distances, sums = residuals
  dropped = _dropped(weights, keep, dropout_rate).astype(value.dtype)
  d_value = jnp.einsum("bhqk,bhqd->bhkd", dropped, cotangent)
  # Contracted as cotangent^T sums, then transposed: XLA:CPU then copies the narrower
  # [.., depth] operand to the layout its matmul wants instead of the [.., 2k+1] sums. (The same
  # for the a^K table's gradient moved a [q_len, kv_len, 2] gather index into the peak memory.)
  d_rel_value = jnp.swapaxes(jnp.einsum(f"bhqd,bhqr->{'dr' if rel_value.ndim == 2 else 'hdr'}",
                                        cotangent, sums.astype(value.dtype)), -1, -2)
  d_sums = jnp.einsum(_table_einsum("bhqd", rel_value, "bhqr"), cotangent,
                      rel_value).astype(jnp.float32)
  d_dropped = jnp.einsum("bhqd,bhkd->bhqk", cotangent, value).astype(jnp.float32)
  d_weights = _dropped(d_dropped, keep, dropout_rate)
  # Softmax VJP: weights * (d - sum_j weights * d), with sum_j dropped * gathered d_sums
  # = sum_r sums * d_sums. The barrier keeps the gather out of the dot-product fusion.
  centre = (jnp.sum(weights * d_weights, axis=-1, keepdims=True)
            + jnp.sum(sums * d_sums, axis=-1, keepdims=True))
  d_logits = jax.lax.optimization_barrier(weights * (d_weights - centre))
  d_logits = d_logits + weights * _dropped(
      _take_weighed_by_distance(d_sums, distances, max_distance), keep, dropout_rate)
  return d_logits, None, d_value, d_rel_value, None


_attend_with_relative_values.defvjp(_attend_with_relative_values_fwd,
                                    _attend_with_relative_values_bwd)


def _weights(query: jax.Array, key: jax.Array, rel_key: jax.Array | None,
             distances: _Distances | None, max_distance: int, bias: jax.Array | None,
             mask: jax.Array | None) -> jax.Array:
  """Attention weights [batch, heads, q_len, kv_len] in float32 (inputs already validated)."""
  return jax.nn.softmax(_logits(_heads_first(query), _heads_first(key), rel_key, distances,
                                max_distance, bias, mask), axis=-1)


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
  _check_inputs(query, key, rel_key, None, max_distance, query_positions, key_positions)
  distances = None if rel_key is None else _distances(
      query_positions, key_positions, mask, query.shape[1], key.shape[1], max_distance)
  return _weights(query, key, rel_key, distances, max_distance, bias, mask)


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


def _bias_attention(query: jax.Array, key: jax.Array, value: jax.Array,
                    rel_key: jax.Array | None, distances: _Distances | None, max_distance: int,
                    bias: jax.Array | None, mask: jax.Array | None,
                    implementation: str) -> jax.Array:
  """`bias_attention` on validated inputs, with `distances` from `_distances`."""
  if rel_key is not None:
    scaled = _heads_first(query) * query.shape[-1] ** -0.5
    relative = _relative_logits(scaled, rel_key, distances, max_distance)
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
  _check_inputs(query, key, rel_key, None, max_distance, query_positions, key_positions)
  distances = None if rel_key is None else _distances(
      query_positions, key_positions, mask, query.shape[1], key.shape[1], max_distance)
  return _bias_attention(query, key, value, rel_key, distances, max_distance, bias, mask,
                         implementation)


def relative_dot_product_attention(query: jax.Array, key: jax.Array, value: jax.Array, *,
                                   rel_key: jax.Array | None = None,
                                   rel_value: jax.Array | None = None, max_distance: int = 0,
                                   bias: jax.Array | None = None, mask: jax.Array | None = None,
                                   query_positions: jax.Array | None = None,
                                   key_positions: jax.Array | None = None,
                                   dropout_rate: float = 0.0,
                                   dropout_rng: jax.Array | None = None,
                                   implementation: str = "auto") -> jax.Array:
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
    implementation: 'xla' (the einsum path of this module), 'cudnn' (cuDNN's fused kernel via
      `bias_attention`) or 'auto' (cuDNN where `cudnn_unsupported` finds no reason against it).

  Returns:
    [batch, q_len, heads, depth] in value's dtype.

  Raises:
    ValueError: on inconsistent shapes, a negative max_distance, a bad dropout_rate, an unknown
      implementation, or 'cudnn' where cuDNN cannot run the call (naming why).
  """
  if value.shape != key.shape:
    raise ValueError(f"value {value.shape} must have the shape of key {key.shape}.")
  if not 0.0 <= dropout_rate < 1.0:
    raise ValueError(f"dropout_rate must be in [0, 1), got {dropout_rate}.")
  _check_inputs(query, key, rel_key, rel_value, max_distance, query_positions, key_positions)
  attend = functools.partial(_attention, query, key, value, bias=bias, mask=mask,
                             query_positions=query_positions, key_positions=key_positions,
                             dropout_rate=dropout_rate, dropout_rng=dropout_rng,
                             use_cudnn=_use_cudnn(implementation, query, key, value, rel_value,
                                                  dropout_rate > 0.0 and dropout_rng is not None))
  # Distances longer than the sequences are never read when the positions span less than them:
  # the middle 2 * reach + 1 rows of each table then stand for all 2k + 1 (a k sweep to 256 on
  # sentences of 48 tokens would otherwise do its per-distance work 5 times over).
  reach = max(query.shape[1], key.shape[1]) - 1
  if (rel_key is None and rel_value is None) or max_distance <= reach:
    return attend(rel_key, rel_value, max_distance)

  def windowed() -> jax.Array:
    return attend(_middle_rows(rel_key, max_distance, reach),
                  _middle_rows(rel_value, max_distance, reach), reach)

  if query_positions is None and key_positions is None:
    return windowed()
  span = _position_span(_as_positions(query_positions, query.shape[1], "query_positions"),
                        _as_positions(key_positions, key.shape[1], "key_positions"))
  return jax.lax.cond(span <= reach, windowed,
                      lambda: attend(rel_key, rel_value, max_distance))


def _use_cudnn(implementation: str, query: jax.Array, key: jax.Array, value: jax.Array,
               rel_value: jax.Array | None, dropout: bool) -> bool:
  """Whether `implementation` ('auto', 'xla', 'cudnn') takes cuDNN for this call.

  Raises:
    ValueError: an unknown implementation, or 'cudnn' where cuDNN cannot run the call.
  """
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}.")
  if implementation == "xla":
    return False
  reason = cudnn_unsupported(query, key, value, rel_value=rel_value, dropout=dropout)
  if implementation == "cudnn" and reason is not None:
    raise ValueError(f"attention implementation 'cudnn' cannot run here: {reason} "
                     f"(use 'auto' or 'xla').")
  return reason is None


def _middle_rows(table: jax.Array | None, max_distance: int, reach: int) -> jax.Array | None:
  """Rows k - reach .. k + reach of a [..., 2k+1, depth] table (distances -reach .. reach)."""
  if table is None:
    return None
  return jax.lax.slice_in_dim(table, max_distance - reach, max_distance + reach + 1, axis=-2)


def _position_span(query_positions: jax.Array, key_positions: jax.Array) -> jax.Array:
  """The largest |key position - query position| any pair of the batch can have."""
  high = jnp.maximum(jnp.max(query_positions), jnp.max(key_positions))
  low = jnp.minimum(jnp.min(query_positions), jnp.min(key_positions))
  return high - low


def _attention(query: jax.Array, key: jax.Array, value: jax.Array, rel_key: jax.Array | None,
               rel_value: jax.Array | None, max_distance: int, *, bias: jax.Array | None,
               mask: jax.Array | None, query_positions: jax.Array | None,
               key_positions: jax.Array | None, dropout_rate: float,
               dropout_rng: jax.Array | None, use_cudnn: bool) -> jax.Array:
  """`relative_dot_product_attention` on validated inputs: [batch, q_len, heads, depth]."""
  distances = None
  if rel_key is not None or rel_value is not None:
    distances = _distances(query_positions, key_positions, mask, query.shape[1], key.shape[1],
                           max_distance)
  dropout = dropout_rate > 0.0 and dropout_rng is not None
  if use_cudnn:
    return _bias_attention(query, key, value, rel_key, distances, max_distance, bias, mask,
                           "cudnn")
  logits = _logits(_heads_first(query), _heads_first(key), rel_key, distances, max_distance,
                   bias, mask)
  keep = None
  if dropout:
    keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, logits.shape)
  if rel_value is not None:
    out = _attend_with_relative_values(logits, keep, _heads_first(value),
                                       rel_value.astype(value.dtype), distances, max_distance,
                                       dropout_rate)
    return _heads_first(out)
  weights = _dropped(jax.nn.softmax(logits, axis=-1), keep, dropout_rate)
  return jnp.einsum("bhqk,bkhd->bqhd", weights.astype(value.dtype), value)


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

  Parameters are float32; `dtype` is the compute dtype of the projections, the attention
  inputs and the decode cache (the logits and softmax stay float32). `implementation` chooses
  the kernel ('auto', 'xla', 'cudnn'; see `relative_dot_product_attention`).
  """

  def __init__(self, num_heads: int, model_dim: int, *, qkv_dim: int, position: str = "none",
               relative_tables: RelativePositionTables | None = None,
               t5_bias: T5RelativeBias | None = None, rope_base: float = 10000.0,
               dropout_rate: float = 0.0, dtype: Any = jnp.float32,
               implementation: str = "auto", rngs: nnx.Rngs):
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
    if implementation not in IMPLEMENTATIONS:
      raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}.")
    self.num_heads = num_heads
    self.head_dim = head_dim
    self.position = position
    self.relative_tables = relative_tables
    self.t5_bias = t5_bias
    self.rope_base = rope_base
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
        implementation=self.implementation,
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
