"""Dot-product attention with relative position representations (Shaw et al. 2018).

The functional core follows the design contract:

  distance(i, j) = clip(key_positions[j] - query_positions[i], -k, k)
  logits[i, j]   = query_i . (key_j + rel_key[distance(i, j) + k]) / sqrt(depth) + bias[i, j]
  weights        = softmax_j(logits masked by `mask`)
  out_i          = sum_j weights[i, j] (value_j + rel_value[distance(i, j) + k])

in its efficient form: the a^K term is q . rel_key^T against the 2k+1 table rows
([batch, heads, q_len, 2k+1]) followed by a gather by clipped distance; the a^V term sums the
attention weights per clipped distance ([batch, heads, q_len, 2k+1]) and multiplies the sums by
rel_value. No [q_len, kv_len, depth] tensor is built (`relpos.kernels.distances` gathers and
sums by distance). A position bias of any variant (T5, ALiBi, ...) enters as `bias`.

The kernel is chosen explicitly (`implementation`, like maxtext's `attention_kernel`): 'xla' is
the path above; 'cudnn' calls `jax.nn.dot_product_attention` with cuDNN's fused kernel, a^K
gathered into its additive bias (`relpos.kernels.fused`), and raises a ValueError naming the
reason where cuDNN cannot run the call (not a GPU, float32, a^V, attention dropout, head depth,
odd lengths); 'auto' takes cuDNN exactly where it can run, else XLA. The logits are float32
whatever the inputs' dtype (the products accumulate in float32), and so is the softmax.

The a^V path has a hand-written backward pass (`_attend_with_relative_values_bwd`) that encodes
the softmax's gradient: a change of the normaliser (say, a softmax with a sink) must change it
too; `tests/test_kernels.py` compares every path's gradients with the naive equations'.
"""
import functools

import jax
import jax.numpy as jnp

from relpos import positions as positions_lib
from relpos.kernels import distances as distances_lib
from relpos.kernels import fused

IMPLEMENTATIONS = ("auto", "xla", "cudnn")


def _logits(query: jax.Array, key: jax.Array, rel_key: jax.Array | None,
            distances: distances_lib.Distances | None, max_distance: int, bias: jax.Array | None,
            mask: jax.Array | None) -> jax.Array:
  """Masked float32 logits [batch, heads, q_len, kv_len] (inputs already validated).

  The products accumulate in float32 whatever the inputs' dtype (bfloat16 logits would round
  each to 8 bits of mantissa before the softmax).

  Args:
    query, key: heads first, [batch, heads, len, depth].
  """
  query = query * query.shape[-1]**-0.5
  # [b, h, q, d] x [b, h, k, d] -> [b, h, q, k], accumulated in float32
  logits = jnp.einsum("bhqd,bhkd->bhqk", query, key, preferred_element_type=jnp.float32)
  if rel_key is not None:
    logits = logits + distances_lib.relative_logits(query, rel_key, distances, max_distance)
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
                                 rel_value: jax.Array, distances: distances_lib.Distances,
                                 max_distance: int, dropout_rate: float) -> jax.Array:
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
    distances: from `distances_lib.distances_of`.
    max_distance: k.
    dropout_rate: the rate `keep` was drawn with.

  Returns:
    [batch, heads, q_len, depth].
  """
  return _attend_with_relative_values_fwd(logits, keep, value, rel_value, distances, max_distance,
                                          dropout_rate)[0]


def _attend_with_relative_values_fwd(logits, keep, value, rel_value, distances, max_distance,
                                     dropout_rate):
  weights = jax.nn.softmax(logits, axis=-1)  # [b, h, q, k] float32
  dropped = _dropped(weights, keep, dropout_rate)  # [b, h, q, k]
  # Summed in float32: an edge bucket collects up to kv_len - k weights.
  sums = distances_lib.sum_by_distance(dropped, distances, max_distance)  # [b, h, q, 2k+1]
  # [b, h, q, k] x [b, h, k, d] -> [b, h, q, d]  plus  [b, h, q, 2k+1] x [(h,) 2k+1, d] -> same
  out = (jnp.einsum("bhqk,bhkd->bhqd", dropped.astype(value.dtype), value) + jnp.einsum(
      distances_lib.table_einsum("bhqr", rel_value, "bhqd"), sums.astype(value.dtype), rel_value))
  return out, (weights, keep, value, rel_value, distances, sums)


def _attend_with_relative_values_bwd(max_distance, dropout_rate, residuals, cotangent):
  weights, keep, value, rel_value, distances, sums = residuals  # cotangent: [b, h, q, d]
  dropped = _dropped(weights, keep, dropout_rate).astype(value.dtype)  # [b, h, q, k]
  # [b, h, q, k] x [b, h, q, d] -> [b, h, k, d]
  d_value = jnp.einsum("bhqk,bhqd->bhkd", dropped, cotangent)
  # Contracted as cotangent^T sums, then transposed: XLA:CPU then copies the narrower
  # [.., depth] operand to the layout its matmul wants instead of the [.., 2k+1] sums. (The same
  # for the a^K table's gradient moved a [q_len, kv_len, 2] gather index into the peak memory.)
  # [b, h, q, d] x [b, h, q, 2k+1] -> [(h,) d, 2k+1] -> [(h,) 2k+1, d]
  d_rel_value = jnp.swapaxes(
      jnp.einsum(f"bhqd,bhqr->{'dr' if rel_value.ndim == 2 else 'hdr'}", cotangent,
                 sums.astype(value.dtype)), -1, -2)
  # Accumulated in float32 as the forward's logits are: the softmax VJP below subtracts sums of
  # these, which bfloat16 results would round to 8 bits first.
  # [b, h, q, d] x [(h,) 2k+1, d] -> [b, h, q, 2k+1]
  d_sums = jnp.einsum(distances_lib.table_einsum("bhqd", rel_value, "bhqr"), cotangent, rel_value,
                      preferred_element_type=jnp.float32)
  # [b, h, q, d] x [b, h, k, d] -> [b, h, q, k]
  d_dropped = jnp.einsum("bhqd,bhkd->bhqk", cotangent, value, preferred_element_type=jnp.float32)
  d_weights = _dropped(d_dropped, keep, dropout_rate)  # [b, h, q, k]
  # Softmax VJP: weights * (d - sum_j weights * d), with sum_j dropped * gathered d_sums
  # = sum_r sums * d_sums. The barrier keeps the gather out of the dot-product fusion.
  centre = (jnp.sum(weights * d_weights, axis=-1, keepdims=True) +
            jnp.sum(sums * d_sums, axis=-1, keepdims=True))  # [b, h, q, 1]
  d_logits = jax.lax.optimization_barrier(weights * (d_weights - centre))  # [b, h, q, k]
  # d_sums [b, h, q, 2k+1] read at each pair's distance: [b, h, q, k]
  d_gathered = distances_lib.take_weighed_by_distance(d_sums, distances, max_distance)
  d_logits = d_logits + weights * _dropped(d_gathered, keep, dropout_rate)
  return d_logits, None, d_value, d_rel_value, None


_attend_with_relative_values.defvjp(_attend_with_relative_values_fwd,
                                    _attend_with_relative_values_bwd)


def _weights(query: jax.Array, key: jax.Array, rel_key: jax.Array | None,
             distances: distances_lib.Distances | None, max_distance: int, bias: jax.Array | None,
             mask: jax.Array | None) -> jax.Array:
  """Attention weights [batch, heads, q_len, kv_len] in float32 (inputs already validated)."""
  return jax.nn.softmax(
      _logits(distances_lib.heads_first(query), distances_lib.heads_first(key), rel_key, distances,
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
    bias: None or float [q_len, kv_len] or [batch or 1, heads or 1, q_len, kv_len], added to
      the logits.
    mask: None or bool [q_len, kv_len] or [batch or 1, heads or 1, q_len, kv_len]; True = may
      attend.
    query_positions: None (0..q_len-1), [q_len] or [batch, q_len] integer positions.
    key_positions: None (0..kv_len-1), [kv_len] or [batch, kv_len] integer positions.

  Returns:
    float32 [batch, heads, q_len, kv_len], rows summing to 1.
  """
  distances_lib.check_inputs(query, key, rel_key, None, max_distance, query_positions,
                             key_positions, bias, mask)
  distances = None if rel_key is None else distances_lib.distances_of(
      query_positions, key_positions, mask, query.shape[1], key.shape[1], max_distance)
  return _weights(query, key, rel_key, distances, max_distance, bias, mask)


def relative_dot_product_attention(query: jax.Array, key: jax.Array, value: jax.Array, *,
                                   rel_key: jax.Array | None = None,
                                   rel_value: jax.Array | None = None, max_distance: int = 0,
                                   bias: jax.Array | None = None, mask: jax.Array | None = None,
                                   query_positions: jax.Array | None = None,
                                   key_positions: jax.Array | None = None,
                                   dropout_rate: float = 0.0, dropout_rng: jax.Array | None = None,
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
    bias: None or float [q_len, kv_len] or [batch or 1, heads or 1, q_len, kv_len], added to
      the logits (T5, ALiBi, ...).
    mask: None or bool [q_len, kv_len] or [batch or 1, heads or 1, q_len, kv_len]; True = may
      attend.
    query_positions: None (0..q_len-1), [q_len] or [batch, q_len] integer positions.
    key_positions: None (0..kv_len-1), [kv_len] or [batch, kv_len] integer positions.
    dropout_rate: attention-weight dropout rate in [0, 1); applied only with a dropout_rng.
    dropout_rng: PRNG key for attention dropout, or None (no dropout).
    implementation: 'xla' (the einsum path of this module), 'cudnn' (cuDNN's fused kernel via
      `fused.bias_attention`) or 'auto' (cuDNN where `fused.cudnn_unsupported` finds no reason
      against it).

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
  distances_lib.check_inputs(query, key, rel_key, rel_value, max_distance, query_positions,
                             key_positions, bias, mask)
  attend = functools.partial(
      _attention, query, key, value, bias=bias, mask=mask, query_positions=query_positions,
      key_positions=key_positions, dropout_rate=dropout_rate, dropout_rng=dropout_rng,
      use_cudnn=_use_cudnn(implementation, query, key, value, rel_value, dropout_rate > 0.0 and
                           dropout_rng is not None))
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
  span = _position_span(
      positions_lib.as_positions(query_positions, query.shape[1], "query_positions"),
      positions_lib.as_positions(key_positions, key.shape[1], "key_positions"))
  return jax.lax.cond(span <= reach, windowed, lambda: attend(rel_key, rel_value, max_distance))


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
  reason = fused.cudnn_unsupported(query, key, value, rel_value=rel_value, dropout=dropout)
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
               key_positions: jax.Array | None, dropout_rate: float, dropout_rng: jax.Array | None,
               use_cudnn: bool) -> jax.Array:
  """`relative_dot_product_attention` on validated inputs: [batch, q_len, heads, depth]."""
  distances = None
  if rel_key is not None or rel_value is not None:
    distances = distances_lib.distances_of(query_positions, key_positions, mask, query.shape[1],
                                           key.shape[1], max_distance)
  dropout = dropout_rate > 0.0 and dropout_rng is not None
  if use_cudnn:
    return fused.attention_with_bias(query, key, value, rel_key, distances, max_distance, bias,
                                     mask, "cudnn")
  logits = _logits(distances_lib.heads_first(query), distances_lib.heads_first(key), rel_key,
                   distances, max_distance, bias, mask)
  keep = None
  if dropout:
    keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, logits.shape)
  if rel_value is not None:
    out = _attend_with_relative_values(logits, keep, distances_lib.heads_first(value),
                                       rel_value.astype(value.dtype), distances, max_distance,
                                       dropout_rate)
    return distances_lib.heads_first(out)
  weights = _dropped(jax.nn.softmax(logits, axis=-1), keep, dropout_rate)
  # [b, h, q, k] x [b, k, h, d] -> [b, q, h, d]
  return jnp.einsum("bhqk,bkhd->bqhd", weights.astype(value.dtype), value)
