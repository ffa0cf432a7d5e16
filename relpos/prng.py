"""jax.random's Threefry-2x32 hash compiled as straight-line code on CPU: the same bits, faster.

On CPU, JAX lowers the `threefry2x32` primitive (the hash behind every `jax.random` draw with
the default key type) to a loop of five iterations, to keep compilation short; on GPU and TPU
it lowers the same 20 rounds unrolled. A loop makes XLA:CPU pass over the whole array once per
iteration instead of fusing the rounds into one pass. Training draws a dropout mask per
sublayer each step, so on CPU the loop is a measurable part of a step: the synthetic model's
train step takes about 10% less time with the hash unrolled, and the quick start's table 11%
less (docs/results.md, measured at commit `95c6fd6`).

`lower_threefry_unrolled_on_cpu()` registers the unrolled form as the CPU lowering. It is the
hash of Salmon et al. (2011), "Parallel random numbers: as easy as 1, 2, 3", exactly as
`jax.random` computes it: the bits, so every dropout mask and initial parameter, are unchanged
(`tests/test_prng.py` checks the paper's known-answer vectors and the bits of a process without
it). The float arithmetic around the hash may fuse differently, so trained parameters can differ
in their last bits from a process without it (by at most 3.7e-9 in the first array compared
after the 30 steps of tests/test_reliability.py's run; the synthetic tables' scores were bitwise
the same): compare runs trained with it on both sides, as the tests do (tests/conftest.py).
"""
import jax.extend.random
import numpy as np
from jax.interpreters import mlir

# Rotation amounts of the four rounds of even and odd groups, and the key schedule's parity.
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_KEY_PARITY = np.uint32(0x1BD11BDA)
_GROUPS = 5  # groups of four rounds: Threefry-2x32-20


def _rotate_left(x, amount: int):
  return (x << np.uint32(amount)) | (x >> np.uint32(32 - amount))


def threefry2x32(key1, key2, count1, count2):
  """The Threefry-2x32-20 hash, unrolled.

  Args:
    key1, key2: uint32 arrays (broadcastable to the counts' shape): the key's two words.
    count1, count2: uint32 arrays of one shape: the counter's two words.

  Returns:
    (word1, word2): uint32 arrays of the counts' shape.
  """
  schedule = (key1, key2, key1 ^ key2 ^ _KEY_PARITY)
  x1, x2 = count1 + schedule[0], count2 + schedule[1]
  for group in range(_GROUPS):
    for amount in _ROTATIONS[group % 2]:
      x1 = x1 + x2
      x2 = x1 ^ _rotate_left(x2, amount)
    x1 = x1 + schedule[(group + 1) % 3]
    x2 = x2 + schedule[(group + 2) % 3] + np.uint32(group + 1)
  return x1, x2


def lower_threefry_unrolled_on_cpu() -> None:
  """Makes every later CPU compilation lower `threefry2x32` with `threefry2x32` above (already
  compiled functions keep their code). Idempotent."""
  mlir.register_lowering(jax.extend.random.threefry2x32_p,
                         mlir.lower_fun(threefry2x32, multiple_results=True), platform="cpu")
