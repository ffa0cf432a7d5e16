"""Tests for relpos.positions: distances, clipping, T5 buckets, sinusoids, RoPE, ALiBi."""
import collections
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from relpos import positions


def test_positions_default_to_0_to_n_and_get_a_batch_axis():
  np.testing.assert_array_equal(positions.as_positions(None, 3, "p"), [[0, 1, 2]])
  np.testing.assert_array_equal(positions.as_positions(np.array([4, 5, 6]), 3, "p"), [[4, 5, 6]])
  given = positions.as_positions(np.array([[0, 1, 0], [0, 1, 2]]), 3, "p")
  assert given.dtype == jnp.int32 and given.shape == (2, 3)
  with pytest.raises(
      ValueError,
      match=r"^inputs_positions must have shape \[5\] or \[batch, 5\], got \(1, 4\)\.$"):
    positions.as_positions(np.zeros((1, 4)), 5, "inputs_positions")


def test_relative_positions_is_key_minus_query():
  got = positions.relative_positions(jnp.array([[0, 1, 2]]), jnp.array([[0, 1, 2, 3]]))
  np.testing.assert_array_equal(got[0], [[0, 1, 2, 3], [-1, 0, 1, 2], [-2, -1, 0, 1]])


def test_clipped_relative_position_index():
  got = positions.clipped_relative_position_index(jnp.arange(4), jnp.arange(4), 1)
  np.testing.assert_array_equal(got, [[1, 2, 2, 2], [0, 1, 2, 2], [0, 0, 1, 2], [0, 0, 0, 1]])
  np.testing.assert_array_equal(
      positions.clipped_relative_position_index(jnp.arange(3), jnp.arange(3), 0), np.zeros((3, 3)))
  # Packed positions [batch, len]: restarts per segment.
  got = positions.clipped_relative_position_index(jnp.array([[0, 1, 0]]), jnp.array([[0, 1, 0]]), 5)
  np.testing.assert_array_equal(got[0], [[5, 6, 5], [4, 5, 4], [5, 6, 5]])
  with pytest.raises(ValueError, match="max_distance"):
    positions.clipped_relative_position_index(jnp.arange(3), jnp.arange(3), -1)


def _t5_bucket_reference(relative_position, bidirectional, num_buckets, max_distance):
  """HF transformers T5Attention._relative_position_bucket, transcribed to numpy (float32 log)."""
  relative_buckets = np.zeros_like(relative_position)
  if bidirectional:
    num_buckets //= 2
    relative_buckets += (relative_position > 0).astype(np.int64) * num_buckets
    relative_position = np.abs(relative_position)
  else:
    relative_position = -np.minimum(relative_position, np.zeros_like(relative_position))
  max_exact = num_buckets // 2
  is_small = relative_position < max_exact
  with np.errstate(divide="ignore", invalid="ignore"):  # log(0) = -inf, masked by is_small
    ratio = np.log(relative_position.astype(np.float32) / np.float32(max_exact))
    relative_position_if_large = max_exact + (ratio / np.float32(math.log(
        max_distance / max_exact)) * np.float32(num_buckets - max_exact)).astype(np.int64)
  relative_position_if_large = np.minimum(relative_position_if_large, num_buckets - 1)
  relative_buckets += np.where(is_small, relative_position, relative_position_if_large)
  return relative_buckets


@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (16, 32), (64, 256), (8, 20)])
@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_bucket_matches_reference(num_buckets, max_distance, bidirectional):
  distances = np.arange(-400, 401)
  got = positions.t5_relative_position_bucket(jnp.asarray(distances), bidirectional=bidirectional,
                                              num_buckets=num_buckets, max_distance=max_distance)
  want = _t5_bucket_reference(distances, bidirectional, num_buckets, max_distance)
  np.testing.assert_array_equal(got, want)
  assert got.dtype == jnp.int32 and got.min() >= 0 and got.max() < num_buckets


def test_t5_bucket_known_values_32_128():
  distances = jnp.array([-100, -50, -10, -5, -1, 0, 1, 5, 10, 50, 100])
  np.testing.assert_array_equal(positions.t5_relative_position_bucket(distances),
                                [15, 13, 8, 5, 1, 0, 17, 21, 24, 29, 31])
  np.testing.assert_array_equal(
      positions.t5_relative_position_bucket(distances, bidirectional=False),
      [30, 24, 10, 5, 1, 0, 0, 0, 0, 0, 0])
  # Any shape; beyond max_distance everything shares the last bucket of its direction.
  got = positions.t5_relative_position_bucket(jnp.array([[-1000, 1000], [-128, 128]]))
  np.testing.assert_array_equal(got, [[15, 31], [15, 31]])


def test_t5_bucket_invalid_args():
  with pytest.raises(ValueError, match="num_buckets"):
    positions.t5_relative_position_bucket(jnp.arange(3), num_buckets=2)
  with pytest.raises(ValueError, match="max_distance"):
    positions.t5_relative_position_bucket(jnp.arange(3), num_buckets=32, max_distance=8)


def test_sinusoidal_position_encoding():
  dim = 6
  enc = positions.sinusoidal_position_encoding(jnp.array([[0, 1, 5]]), dim)
  assert enc.shape == (1, 3, dim) and enc.dtype == jnp.float32
  np.testing.assert_allclose(enc[0, 0], [0, 0, 0, 1, 1, 1], atol=1e-7)
  for p_index, p in enumerate([0, 1, 5]):
    for c in range(dim // 2):
      angle = p / 10000**(2 * c / dim)
      np.testing.assert_allclose(enc[0, p_index, c], math.sin(angle), atol=1e-6)
      np.testing.assert_allclose(enc[0, p_index, dim // 2 + c], math.cos(angle), atol=1e-6)
  with pytest.raises(ValueError, match="dim"):
    positions.sinusoidal_position_encoding(jnp.arange(3), 5)


def get_timing_signal_1d(length, channels, min_timescale=1.0, max_timescale=1.0e4):
  """tensor2tensor common_attention.get_timing_signal_1d, transcribed to numpy: [1, length,
  channels]."""
  position = np.arange(length, dtype=np.float32)
  num_timescales = channels // 2
  log_timescale_increment = (math.log(float(max_timescale) / float(min_timescale)) /
                             max(num_timescales - 1, 1))
  inv_timescales = min_timescale * np.exp(
      np.arange(num_timescales, dtype=np.float32) * -log_timescale_increment)
  scaled_time = position[:, None] * inv_timescales[None, :]
  signal = np.concatenate([np.sin(scaled_time), np.cos(scaled_time)], axis=1)
  signal = np.pad(signal, [[0, 0], [0, channels % 2]])
  return signal.reshape([1, length, channels])


@pytest.mark.parametrize("dim", [2, 8, 64])
def test_t2t_timing_signal_matches_tensor2tensor(dim):
  expected = get_timing_signal_1d(256, dim)
  np.testing.assert_allclose(positions.t2t_timing_signal(jnp.arange(256)[None], dim), expected,
                             atol=2e-4)
  ours = positions.t2t_timing_signal(jnp.array([[3, 100]]), dim, min_timescale=2.0,
                                     max_timescale=50.0)
  np.testing.assert_allclose(ours[0],
                             get_timing_signal_1d(101, dim, 2.0, 50.0)[0, [3, 100]], atol=2e-5)
  with pytest.raises(ValueError, match="dim"):
    positions.t2t_timing_signal(jnp.arange(3), 7)


def test_sinusoid_is_not_the_t2t_timing_signal():
  """Same layout, other frequencies: at d = 64 they differ by up to 1.99 over 256 positions."""
  at = jnp.arange(256)[None]
  gap = np.abs(positions.sinusoidal_position_encoding(at, 64) - positions.t2t_timing_signal(at, 64))
  assert 1.98 < gap.max() <= 2.0
  np.testing.assert_allclose(gap[..., [0, 32]], 0, atol=1e-6)  # the first frequency is shared


def _float64_angles(num_positions: int, dim: int, base: float = 10000.0) -> np.ndarray:
  """p * base ** (-2c / dim) in float64: [num_positions, dim / 2]."""
  exponents = -np.arange(0, dim, 2, dtype=np.float64) / dim
  return np.arange(num_positions, dtype=np.float64)[:, None] * base**exponents


def test_sinusoid_angles_are_float64_accurate():
  """Frequencies computed in float64 and rounded once leave only the float32 product's rounding
  in the angles: 1.5e-4 at d = 64 below position 4,096."""
  angles = _float64_angles(4096, 64)
  encoding = positions.sinusoidal_position_encoding(jnp.arange(4096)[None], 64)[0]
  expected = np.concatenate([np.sin(angles), np.cos(angles)], axis=-1)
  assert np.abs(np.asarray(encoding, np.float64) - expected).max() < 1.6e-4


def test_rope_angles_are_float64_accurate():
  """x = (1, ..., 1, 0, ..., 0) rotates to (cos, sin) of the angles, 1.5e-4 off at most."""
  angles = _float64_angles(4096, 64)
  x = jnp.concatenate([jnp.ones((1, 4096, 1, 32)), jnp.zeros((1, 4096, 1, 32))], axis=-1)
  rotated = np.asarray(positions.apply_rope(x, jnp.arange(4096)[None]), np.float64)[0, :, 0]
  expected = np.concatenate([np.cos(angles), np.sin(angles)], axis=-1)
  assert np.abs(rotated - expected).max() < 1.6e-4


def test_rope_preserves_norm_and_is_relative():
  x = jax.random.normal(jax.random.key(0), (1, 2, 3, 8))  # [b, n, h, d]
  q, k = x[:, :1], x[:, 1:]
  pos = jnp.array([[0, 7]])
  rotated = positions.apply_rope(x, pos)
  np.testing.assert_allclose(rotated[:, 0], x[:, 0], atol=1e-6)  # position 0: identity
  np.testing.assert_allclose(jnp.linalg.norm(rotated, axis=-1), jnp.linalg.norm(x, axis=-1),
                             rtol=1e-5)
  assert not np.allclose(rotated[:, 1], x[:, 1])

  def score(m, n):
    rq = positions.apply_rope(q, jnp.array([[m]]))
    rk = positions.apply_rope(k, jnp.array([[n]]))
    return jnp.sum(rq * rk, axis=-1)  # [1, 1, h]

  np.testing.assert_allclose(score(5, 2), score(13, 10), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(score(0, 4), score(100, 104), rtol=1e-4, atol=1e-5)
  assert not np.allclose(score(5, 2), score(5, 3), atol=1e-3)
  with pytest.raises(ValueError, match="even"):
    positions.apply_rope(jnp.ones((1, 2, 1, 3)), jnp.zeros((1, 2)))


def test_alibi_slopes():
  np.testing.assert_allclose(positions.alibi_slopes(8), 2.0**-np.arange(1, 9))
  # Press et al.: 4-head slopes, then every other slope of 8 heads.
  np.testing.assert_allclose(positions.alibi_slopes(6), [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3])
  np.testing.assert_allclose(positions.alibi_slopes(1), [2**-8])
  with pytest.raises(ValueError, match="num_heads"):
    positions.alibi_slopes(0)


def test_alibi_bias():
  bias = positions.alibi_bias(jnp.array([[0, 1, 2]]), jnp.array([[0, 1, 2]]), jnp.array([0.5, 2.0]))
  assert bias.shape == (1, 2, 3, 3)
  distance = np.array([[0, 1, 2], [1, 0, 1], [2, 1, 0]])
  np.testing.assert_allclose(bias[0, 0], -0.5 * distance)
  np.testing.assert_allclose(bias[0, 1], -2.0 * distance)


def test_segment_slots():
  slot, length = positions.segment_slots(np.array([[0, 1, 2, 0, 1, 0, 0]]))
  np.testing.assert_array_equal(slot, [[0, 0, 0, 1, 1, 2, 3]])
  np.testing.assert_array_equal(length, [[3, 2, 1, 1, 0, 0, 0]])


def test_shifted_positions_shift_each_segment_by_one_offset_up_to_k():
  given = np.array([[0, 1, 2, 0, 1, 2, 3]] * 200)
  offsets = np.asarray(positions.shifted_positions(jax.random.key(0), given, 4)) - given
  np.testing.assert_array_equal(offsets[:, :3], offsets[:, :1].repeat(3, 1))
  np.testing.assert_array_equal(offsets[:, 3:], offsets[:, 3:4].repeat(4, 1))
  assert set(offsets[:, 0]) == set(offsets[:, 3]) == {0, 1, 2, 3, 4}
  assert (offsets[:, 0] != offsets[:, 3]).mean() > 0.6  # independent: 0.8 expected


def test_random_sorted_positions_are_uniform_subsets_per_segment():
  # Segments of 2 and 3 tokens, each a subset of range(5): 10 subsets each, equally likely.
  given = np.array([[0, 1, 0, 1, 2]] * 4000)
  drawn = np.asarray(positions.random_sorted_positions(jax.random.key(1), given, 5))
  for segment in (drawn[:, :2], drawn[:, 2:]):
    assert (np.diff(segment, axis=1) > 0).all() and segment.min() >= 0 and segment.max() < 5
    counts = collections.Counter(map(tuple, segment))
    assert len(counts) == 10
    chi2 = sum((c - 400)**2 / 400 for c in counts.values())
    assert chi2 < 27.9  # 9 degrees of freedom, p = 0.001
  # A segment as long as L takes every position.
  full = positions.random_sorted_positions(jax.random.key(2), np.arange(6)[None], 6)
  np.testing.assert_array_equal(full, [np.arange(6)])
