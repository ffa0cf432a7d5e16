"""Clipped relative distances of (query, key) pairs, and gathering and summing by them.

The Shaw et al. (2018) tables have 2k+1 rows; pair (i, j) reads row
clip(key_positions[j] - query_positions[i], -k, k) + k. The efficient kernel never builds a
[q_len, kv_len, depth] tensor: it multiplies by the 2k+1 rows ([batch, heads, q_len, 2k+1])
and then gathers by each pair's row (a^K logits) or sums per row (a^V, and the gradients).

Summing per distance is a scatter-add in general, which is slow on CPU. When every pair the
softmax can weigh has distance clip(j - i) (positions 0..n-1, or positions restarting per
packed segment whose mask keeps segments apart), the sums are the band |j - i| < k read along
diagonals plus two masked row sums, and rows whose weighed pairs all share one distance
(padding) are a row sum; the gather likewise reads one pattern shared by the whole batch
instead of a per-pair index. This structure is checked at run time from the positions and the
mask in one pass over the pairs (`distances_of`); a `lax.cond` takes the per-pair gather and
scatter-add whenever it does not hold, so results are exact for arbitrary positions. Without
positions no check is needed.
"""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from relpos import positions as positions_lib


def _check_table(table: jax.Array | None, name: str, max_distance: int, num_heads: int,
                 depth: int) -> None:
  """Raises ValueError unless `table` is None, [2k+1, depth] or [heads, 2k+1, depth]."""
  if table is None:
    return
  rows = 2 * max_distance + 1
  if tuple(table.shape) not in ((rows, depth), (num_heads, rows, depth)):
    raise ValueError(f"{name} must have shape [{rows}, {depth}] or [{num_heads}, {rows}, {depth}] "
                     f"(2*max_distance+1 rows for max_distance={max_distance}), got {table.shape}.")


def _check_broadcasts(name: str, x: jax.Array | None, logits_shape: tuple[int, ...]) -> None:
  """Raises ValueError unless `x` (a bias or mask) is None, [q_len, kv_len] or of rank 4, and
  broadcasts to `logits_shape` [batch, heads, q_len, kv_len] without making it bigger.

  Rank 3 is refused: [batch, q_len, kv_len] would broadcast as [1, batch, q_len, kv_len], each
  sequence's mask read as a head's."""
  if x is None:
    return
  shape = tuple(np.shape(x))
  try:
    fits = len(shape) in (2, 4) and np.broadcast_shapes(shape, logits_shape) == logits_shape
  except ValueError:
    fits = False
  if not fits:
    raise ValueError(f"{name} has shape {shape}; it must be [q_len, kv_len] or [batch or 1, "
                     f"heads or 1, q_len, kv_len] for [batch, heads, q_len, kv_len] = "
                     f"{logits_shape}.")


def check_inputs(query: jax.Array, key: jax.Array, rel_key: jax.Array | None,
                 rel_value: jax.Array | None, max_distance: int, query_positions: jax.Array | None,
                 key_positions: jax.Array | None, bias: jax.Array | None = None,
                 mask: jax.Array | None = None) -> None:
  """Raises ValueError on inconsistent shapes, tables, bias, mask or positions (the arguments of
  `relative.relative_dot_product_attention`)."""
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
  logits_shape = (query.shape[0], num_heads, q_len, key.shape[1])
  _check_broadcasts("bias", bias, logits_shape)
  _check_broadcasts("mask", mask, logits_shape)
  positions_lib.as_positions(query_positions, q_len, "query_positions")
  positions_lib.as_positions(key_positions, key.shape[1], "key_positions")


@functools.partial(
    jax.tree_util.register_dataclass, data_fields=[
        "query_positions", "key_positions", "structured", "constant_row", "constant_index"
    ], meta_fields=["q_len", "kv_len"])
@dataclasses.dataclass(frozen=True)
class Distances:
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


def _sequential_index(distances: Distances, max_distance: int) -> jax.Array:
  """int32 [1, 1, q_len, kv_len]: clip(j - i, -k, k) + k."""
  return positions_lib.clipped_relative_position_index(
      jnp.arange(distances.q_len, dtype=jnp.int32), jnp.arange(distances.kv_len, dtype=jnp.int32),
      max_distance)[None, None]


def _pair_index(distances: Distances, max_distance: int) -> jax.Array:
  """int32 [batch or 1, 1, q_len, kv_len]: each pair's index from the explicit positions."""
  return positions_lib.clipped_relative_position_index(distances.query_positions,
                                                       distances.key_positions, max_distance)[:,
                                                                                              None]


def without_empty_rows(mask: jax.Array) -> jax.Array:
  """`mask` (bool [..., q_len, kv_len]) with each query row that may attend nowhere opened to
  every key: what a softmax over such a row weighs (uniform weights; `_pairs_weighed`), and what
  the cuDNN path passes (`fused.attention_with_bias`).

  cuDNN's fused backward pass gives NaN gradients for such rows (their log-sum-exp lies below
  ln of float32's smallest normal; seen on an H200 at length 64, and reported for PyTorch's
  cuDNN attention at lengths 64 mod 128). The rows are padding queries, whose outputs no loss
  and no other position reads, so what they attend to changes no result.
  """
  return mask | ~jnp.any(mask, axis=-1, keepdims=True)


def _pairs_weighed(mask: jax.Array | None, q_len: int, kv_len: int) -> jax.Array | None:
  """bool [batch or 1, 1, q_len, kv_len]: pairs the softmax can weigh in some head (None: all).

  A row that a head masks completely gets uniform weights over all its keys, so it counts whole.
  """
  if mask is None:
    return None
  mask = jnp.asarray(mask, bool)
  mask = without_empty_rows(mask.reshape((1,) * (4 - mask.ndim) + mask.shape))
  weighed = jnp.any(mask, axis=1, keepdims=True)
  return jnp.broadcast_to(weighed, weighed.shape[:2] + (q_len, kv_len))


def distances_of(query_positions: jax.Array | None, key_positions: jax.Array | None,
                 mask: jax.Array | None, q_len: int, kv_len: int, max_distance: int) -> Distances:
  """The positions and the run-time check of the structure the shared pattern exploits.

  Args:
    query_positions: None (0..q_len-1), int [q_len] or [batch, q_len].
    key_positions: None (0..kv_len-1), int [kv_len] or [batch, kv_len].
    mask: None or bool [q_len, kv_len] or [batch or 1, heads or 1, q_len, kv_len] (validated by
      `check_inputs`); True = may attend.
    q_len, kv_len: the query and key lengths.
    max_distance: the clipping distance k.
  """
  if query_positions is None and key_positions is None:
    return Distances(q_len, kv_len)
  distances = Distances(q_len, kv_len,
                        positions_lib.as_positions(query_positions, q_len, "query_positions"),
                        positions_lib.as_positions(key_positions, kv_len, "key_positions"))
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
  operands = [
      jnp.where(offset <= -max_distance, values, zero),
      jnp.where(offset >= max_distance, values, zero)
  ]
  if constant_row is not None:
    operands.append(values)
  edges = jax.lax.reduce(tuple(operands), (zero,) * len(operands),
                         lambda x, y: tuple(a + b for a, b in zip(x, y)), (values.ndim - 1,))
  before, after = edges[0][..., None], edges[1][..., None]
  columns = jnp.arange(q_len)[:, None] + jnp.arange(-max_distance, max_distance + 1)[None, :]
  inside = (columns >= 0) & (columns < kv_len)
  diagonals = jnp.take_along_axis(values,
                                  jnp.clip(columns, 0, kv_len - 1)[None, None], axis=-1,
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


def sum_by_distance(values: jax.Array, distances: Distances, max_distance: int) -> jax.Array:
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


def _take_by_distance(per_distance: jax.Array, distances: Distances,
                      max_distance: int) -> jax.Array:
  """per_distance [batch, heads, q_len, 2k+1] read at each pair's index: [..., q_len, kv_len].

  A gather that fuses into its consumer (the logits): the shared pattern without positions, else
  the per-pair index.
  """
  if distances.structured is None:
    return _take(per_distance, _sequential_index(distances, max_distance))
  return _take(per_distance, _pair_index(distances, max_distance))


def take_weighed_by_distance(per_distance: jax.Array, distances: Distances,
                             max_distance: int) -> jax.Array:
  """`_take_by_distance` on the pairs the softmax can weigh (elsewhere the values may differ).

  Reads the shared pattern, with constant rows fixed per row, when the structure holds. The
  `lax.cond` choosing it gives its result a buffer of its own, so this is for gathers that are
  materialized anyway (on a fused gather the buffer would cost a [batch, heads, q_len, kv_len]
  array; benchmarks/design.md gives the memory it would cost).
  """
  if distances.structured is None:
    return _take(per_distance, _sequential_index(distances, max_distance))

  def structured(per_distance: jax.Array) -> jax.Array:
    constant = _take(per_distance, distances.constant_index)
    return jnp.where(distances.constant_row, constant,
                     _take(per_distance, _sequential_index(distances, max_distance)))

  return jax.lax.cond(
      distances.structured, structured,
      functools.partial(_take_by_distance, distances=distances, max_distance=max_distance),
      per_distance)


def table_einsum(lhs: str, table: jax.Array, out: str) -> str:
  """Einsum spec contracting with a shared [r, d] or per-head [h, r, d] table."""
  return f"{lhs},{'rd' if table.ndim == 2 else 'hrd'}->{out}"


def heads_first(x: jax.Array) -> jax.Array:
  """[batch, len, heads, depth] -> [batch, heads, len, depth] (the layout of the matmuls)."""
  return jnp.swapaxes(x, 1, 2)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _gather_by_distance(per_distance: jax.Array, distances: Distances,
                        max_distance: int) -> jax.Array:
  """`_take_by_distance` whose gradient is `sum_by_distance` (valid because the logits'
  cotangent vanishes off the pairs the mask keeps)."""
  return _take_by_distance(per_distance, distances, max_distance)


def _gather_fwd(per_distance, distances, max_distance):
  # per_distance [b, h, q, 2k+1] -> gathered [b, h, q, kv]; only the index structure is kept.
  return _gather_by_distance(per_distance, distances, max_distance), distances


def _gather_bwd(max_distance, distances, cotangent):
  # cotangent [b, h, q, kv] summed per distance -> [b, h, q, 2k+1]; positions get no gradient.
  return sum_by_distance(cotangent, distances, max_distance), None


_gather_by_distance.defvjp(_gather_fwd, _gather_bwd)


def relative_logits(query: jax.Array, rel_key: jax.Array, distances: Distances,
                    max_distance: int) -> jax.Array:
  """a^K term query_i . rel_key[distance(i, j)]: [b, h, q_len, kv_len].

  Args:
    query: pre-scaled, heads first [batch, heads, q_len, depth].
  """
  return _gather_by_distance(logits_per_distance(query, rel_key), distances, max_distance)


def logits_per_distance(query: jax.Array, rel_key: jax.Array) -> jax.Array:
  """query_i . rel_key[r] for every table row r (clipped distance r - k): float32
  [batch, heads, q_len, 2k+1].

  Args:
    query: heads first [batch, heads, q_len, depth] (pre-scaled for the logits).
    rel_key: [2k+1, depth] or [heads, 2k+1, depth].
  """
  # [b, h, q, d] x [(h,) 2k+1, d] -> [b, h, q, 2k+1], accumulated in float32
  return jnp.einsum(table_einsum("bhqd", rel_key, "bhqr"), query, rel_key.astype(query.dtype),
                    preferred_element_type=jnp.float32)
