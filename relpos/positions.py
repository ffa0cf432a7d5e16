"""Pure position functions: a sequence's positions, relative distances, clipping, T5 buckets,
sinusoids, RoPE, ALiBi.

Everything here is a pure function of integer positions (and, for RoPE, the vectors to rotate).
Relative positions always follow the design contract: key position minus query position, j - i.
"""
import math

import jax
import jax.numpy as jnp
import numpy as np


def as_positions(positions: jax.Array | None, length: int, name: str) -> jax.Array:
  """int32 positions [batch or 1, length] of [length] or [batch, length] `positions`, or
  0..length-1 when None; raises ValueError naming the argument `name` on another shape."""
  if positions is None:
    return jnp.arange(length, dtype=jnp.int32)[None]
  positions = jnp.asarray(positions, jnp.int32)
  if positions.ndim == 1:
    positions = positions[None]
  if positions.ndim != 2 or positions.shape[-1] != length:
    raise ValueError(f"{name} must have shape [{length}] or [batch, {length}], "
                     f"got {positions.shape}.")
  return positions


def relative_positions(query_positions: jnp.ndarray, key_positions: jnp.ndarray) -> jnp.ndarray:
  """Relative position of every key seen from every query.

  Args:
    query_positions: integer array [..., q_len].
    key_positions: integer array [..., kv_len]; leading dims broadcast against the query's.

  Returns:
    Integer array [..., q_len, kv_len] holding key_positions[j] - query_positions[i].
  """
  query_positions = jnp.asarray(query_positions)
  key_positions = jnp.asarray(key_positions)
  return key_positions[..., None, :] - query_positions[..., :, None]


def clipped_relative_position_index(query_positions: jnp.ndarray, key_positions: jnp.ndarray,
                                    max_distance: int) -> jnp.ndarray:
  """Row index into a (2k+1)-row relative table (Shaw et al. 2018, eq. 5).

  Args:
    query_positions: integer array [..., q_len].
    key_positions: integer array [..., kv_len].
    max_distance: the clipping distance k >= 0.

  Returns:
    int32 array [..., q_len, kv_len] in [0, 2k]: clip(j - i, -k, k) + k.

  Raises:
    ValueError: if max_distance is negative.
  """
  if max_distance < 0:
    raise ValueError(f"max_distance must be >= 0, got {max_distance}.")
  distance = relative_positions(query_positions, key_positions)
  return (jnp.clip(distance, -max_distance, max_distance) + max_distance).astype(jnp.int32)


def t5_relative_position_bucket(relative_position: jnp.ndarray, *, bidirectional: bool = True,
                                num_buckets: int = 32, max_distance: int = 128) -> jnp.ndarray:
  """The T5 mapping from relative positions to logarithmic buckets (Raffel et al. 2020).

  Half of the buckets (after splitting by direction when bidirectional) hold exact distances;
  the rest grow logarithmically up to `max_distance`, beyond which everything shares the last
  bucket. Matches mesh-tensorflow / HF T5 `_relative_position_bucket`.

  Args:
    relative_position: integer array of any shape: key position minus query position (j - i).
    bidirectional: if True, keys after the query (j > i) get their own half of the buckets;
      if False (causal), every j >= i falls in bucket 0.
    num_buckets: the number of buckets.
    max_distance: distances at or beyond this share the last bucket of their direction.

  Returns:
    int32 array of the same shape with bucket ids in [0, num_buckets).

  Raises:
    ValueError: if num_buckets is too small for the direction split, or max_distance is not
      above the exact range.
  """
  exact_buckets = num_buckets // 2 if bidirectional else num_buckets
  max_exact = exact_buckets // 2
  if max_exact < 1:
    raise ValueError(f"num_buckets={num_buckets} is too small (bidirectional={bidirectional}); "
                     f"need at least {4 if bidirectional else 2}.")
  if max_distance <= max_exact:
    raise ValueError(f"max_distance={max_distance} must exceed the exact range {max_exact} "
                     f"(num_buckets={num_buckets}, bidirectional={bidirectional}).")
  relative_position = jnp.asarray(relative_position).astype(jnp.int32)
  if bidirectional:
    offset = jnp.where(relative_position > 0, exact_buckets, 0)
    distance = jnp.abs(relative_position)
  else:
    offset = 0
    distance = jnp.maximum(-relative_position, 0)
  # log is only used where distance >= max_exact >= 1; the maximum keeps log finite elsewhere.
  scaled = (jnp.log(jnp.maximum(distance, 1).astype(jnp.float32) / max_exact) /
            math.log(max_distance / max_exact) * (exact_buckets - max_exact))
  large = jnp.minimum(max_exact + scaled.astype(jnp.int32), exact_buckets - 1)
  return (offset + jnp.where(distance < max_exact, distance, large)).astype(jnp.int32)


def _sin_then_cos(positions: jnp.ndarray, inv_timescales: np.ndarray) -> jnp.ndarray:
  """[sin(p * inv_timescales), cos(p * inv_timescales)] of positions [..., n]: [..., n, 2t]."""
  angles = jnp.asarray(positions, jnp.float32)[..., None] * inv_timescales
  return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)


def inverse_frequencies(base: float, dim: int) -> np.ndarray:
  """base ** (-2c / dim) for c < dim / 2: float32 [dim / 2], computed in float64 and rounded once
  (as Hugging Face does), so an angle p * inverse_frequencies carries only the float32 product's
  rounding (1.5e-4 at most at p < 4,096 and dim = 64)."""
  return (base**(-np.arange(0, dim, 2, dtype=np.float64) / dim)).astype(np.float32)


def _check_even(dim: int) -> None:
  if dim <= 0 or dim % 2:
    raise ValueError(f"dim must be a positive even number, got {dim}.")


def sinusoidal_position_encoding(positions: jnp.ndarray, dim: int,
                                 max_timescale: float = 10000.0) -> jnp.ndarray:
  """Sinusoidal encodings with the frequencies of Vaswani et al. (2017), sin half then cos half.

  Channel c < dim/2 is sin(p / max_timescale**(2c/dim)), channel dim/2 + c the matching cos:
  the paper's frequencies 10000^(-2i/d) (its equation interleaves sin and cos; here they are
  concatenated). tensor2tensor's `get_timing_signal_1d` and flax examples/wmt use the same
  layout but other frequencies, 10000^(-i/(d/2 - 1)) (`t2t_timing_signal`); at dim = 64 the
  two encodings differ by up to 1.99.

  Args:
    positions: integer or float array [..., n].
    dim: encoding width (even).
    max_timescale: the longest wavelength scale (10000 in the paper).

  Returns:
    float32 array [..., n, dim].

  Raises:
    ValueError: if dim is not a positive even number.
  """
  _check_even(dim)
  return _sin_then_cos(positions, inverse_frequencies(max_timescale, dim))


def t2t_timing_signal(positions: jnp.ndarray, dim: int, min_timescale: float = 1.0,
                      max_timescale: float = 1.0e4) -> jnp.ndarray:
  """tensor2tensor's `get_timing_signal_1d` (what Shaw et al. 2018 trained with) at `positions`.

  With t = dim/2 timescales spaced geometrically from min_timescale to max_timescale, channel
  c < t is sin(p * min_timescale * exp(-c * ln(max_timescale / min_timescale) / (t - 1))) and
  channel t + c the matching cos (flax examples/wmt's `sinusoidal_init` is the same).

  Args:
    positions: integer or float array [..., n].
    dim: encoding width (even).
    min_timescale, max_timescale: the shortest and longest wavelength scales.

  Returns:
    float32 array [..., n, dim].

  Raises:
    ValueError: if dim is not a positive even number.
  """
  _check_even(dim)
  num_timescales = dim // 2
  increment = math.log(max_timescale / min_timescale) / max(num_timescales - 1, 1)
  inv_timescales = min_timescale * np.exp(-increment * np.arange(num_timescales, dtype=np.float64))
  return _sin_then_cos(positions, inv_timescales.astype(np.float32))


def apply_rope(x: jnp.ndarray, positions: jnp.ndarray, base: float = 10000.0) -> jnp.ndarray:
  """Rotary position embedding (Su et al. 2021), rotate-half layout.

  Channel c and c + d/2 form a pair rotated by angle positions * base**(-2c/d), so the dot
  product of a rotated query at m and a rotated key at n depends on m - n only.

  Args:
    x: array [batch, n, heads, depth] with even depth.
    positions: integer array [batch, n] (or broadcastable, e.g. [1, n]).
    base: the RoPE base.

  Returns:
    Array of x's shape and dtype (computed in float32).

  Raises:
    ValueError: if depth is odd.
  """
  depth = x.shape[-1]
  if depth % 2:
    raise ValueError(f"apply_rope needs an even depth, got x.shape={x.shape}.")
  angles = (jnp.asarray(positions, jnp.float32)[..., None, None] * inverse_frequencies(base, depth)
           )  # [b, n, 1, d/2]
  cos, sin = jnp.cos(angles), jnp.sin(angles)
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  rotated = jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
  return rotated.astype(x.dtype)


def alibi_slopes(num_heads: int) -> jnp.ndarray:
  """Per-head ALiBi slopes (Press et al. 2022), including their rule for non-powers of 2.

  For n = 2^m heads the slopes are the geometric sequence 2^(-8/n), 2^(-16/n), ..., 2^-8.
  Otherwise the slopes for the closest smaller power of two are followed by every other slope
  of twice that power.

  Args:
    num_heads: number of heads (>= 1).

  Returns:
    float32 array [num_heads].

  Raises:
    ValueError: if num_heads < 1.
  """
  if num_heads < 1:
    raise ValueError(f"num_heads must be >= 1, got {num_heads}.")

  def power_of_two_slopes(n: int) -> np.ndarray:
    return 2.0**(-8.0 * np.arange(1, n + 1) / n)

  closest = 2**int(math.floor(math.log2(num_heads)))
  slopes = power_of_two_slopes(closest)
  if closest != num_heads:
    slopes = np.concatenate([slopes, power_of_two_slopes(2 * closest)[0::2][:num_heads - closest]])
  return jnp.asarray(slopes, jnp.float32)


def alibi_bias(query_positions: jnp.ndarray, key_positions: jnp.ndarray,
               slopes: jnp.ndarray) -> jnp.ndarray:
  """Symmetric ALiBi bias -slope * |j - i| (causality is left to the attention mask).

  Args:
    query_positions: integer array [batch, q_len].
    key_positions: integer array [batch, kv_len].
    slopes: float array [heads].

  Returns:
    float32 array [batch, heads, q_len, kv_len].
  """
  distance = jnp.abs(relative_positions(query_positions, key_positions)).astype(jnp.float32)
  return -jnp.asarray(slopes, jnp.float32)[:, None, None] * distance[:, None]


def segment_slots(positions: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
  """Which packed segment each token is in, and each segment's length.

  A segment starts wherever its position is 0 (padding, also at position 0, makes one-token
  segments of its own).

  Args:
    positions: integer array [batch, n], restarting at 0 per segment.

  Returns:
    (slot int32 [batch, n]: the token's segment 0, 1, ... within its row; length int32
    [batch, n]: the length of segment s at index s, 0 for slots without a segment).
  """
  positions = jnp.asarray(positions, jnp.int32)
  slot = jnp.cumsum(positions == 0, axis=-1, dtype=jnp.int32) - 1
  rows = jnp.arange(positions.shape[0])[:, None]
  length = jnp.zeros(positions.shape, jnp.int32).at[rows, slot].max(positions + 1)
  return slot, length


def shifted_positions(key: jax.Array, positions: jnp.ndarray, max_shift: int) -> jnp.ndarray:
  """SHAPE (Kiyono et al. 2021): positions + k, one k ~ U{0, ..., max_shift} per segment.

  Args:
    key: a jax.random key.
    positions: integer array [batch, n], restarting at 0 per packed segment.
    max_shift: K, the largest offset.

  Returns:
    int32 [batch, n].
  """
  slot, _ = segment_slots(positions)
  offsets = jax.random.randint(key, positions.shape, 0, max_shift + 1)  # [b, slots]
  return positions + jnp.take_along_axis(offsets, slot, axis=-1)


def random_sorted_positions(key: jax.Array, positions: jnp.ndarray,
                            max_position: int) -> jnp.ndarray:
  """Randomized positions (Ruoss et al. 2023): each segment's positions 0..m-1 replaced by a
  sorted subset of range(max_position), drawn uniformly among the subsets of m elements.

  The subsets come from Floyd's algorithm, one per segment, in n vectorized steps (exact, and
  O(n^3) work and O(n^2) memory per row instead of sorting max_position scores per segment).

  Args:
    key: a jax.random key.
    positions: integer array [batch, n], restarting at 0 per packed segment.
    max_position: L >= n, the number of positions drawn from.

  Returns:
    int32 [batch, n], strictly increasing within each segment.
  """
  positions = jnp.asarray(positions, jnp.int32)
  batch, n = positions.shape
  slot, length = segment_slots(positions)  # [b, n] each

  uniform = jax.random.uniform(key, (n, batch, n))  # [steps, b, slots]

  def draw(i, chosen):  # chosen: [b, slots, n], max_position where not drawn yet
    top = max_position - length + i  # [b, slots]: step i draws from 0..top
    pick = jnp.minimum(jnp.floor(uniform[i] * (top + 1)).astype(jnp.int32), top)
    taken = jnp.any(chosen == pick[..., None], axis=-1)  # [b, slots]
    new = jnp.where(taken, top, pick)
    return chosen.at[:, :, i].set(jnp.where(i < length, new, max_position))

  chosen = jnp.full((batch, n, n), max_position, jnp.int32)
  chosen = jax.lax.fori_loop(0, n, draw, chosen, unroll=True)
  ordered = jnp.sort(chosen, axis=-1)  # [b, slots, n]
  rows = jnp.arange(batch)[:, None]
  return ordered[rows, slot, positions]
