"""Tests for relpos.prng: the unrolled Threefry-2x32 lowering gives jax.random's bits."""
import json
import os
import subprocess
import sys

import jax
import jax.extend.random
import numpy as np
import pytest

from relpos import prng

# Known-answer vectors of Threefry-2x32-20 (Random123's kat_vectors, as in JAX's own tests):
# (key words, counter words) -> output words.
KNOWN_ANSWERS = [
    ((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6b200159, 0x99ba4efe)),
    ((0xffffffff, 0xffffffff), (0xffffffff, 0xffffffff), (0x1cb996fc, 0xbb002be7)),
    ((0x13198a2e, 0x03707344), (0x243f6a88, 0x85a308d3), (0xc4923a9c, 0x483df7a0)),
]

# Run in a fresh process with argument "rolled" (JAX's own CPU lowering) or "unrolled"
# (relpos's): whether the compiled hash loops, and the sha256 of draws of the kinds training
# makes (dropout masks, initializers, key splits).
DRAWS = """
import hashlib, json, sys
import jax, numpy as np
if sys.argv[1] == "unrolled":
  from relpos import prng
  prng.lower_threefry_unrolled_on_cpu()
key = jax.random.key(42)
draws = {
    "bits": jax.random.bits(key, (1000, 37)),
    "dropout_mask": jax.jit(lambda k: jax.random.bernoulli(k, 0.9, (32, 48, 64)))(
        jax.random.fold_in(key, 3)),
    "normal": jax.random.normal(key, (333,)),
    "truncated_normal": jax.random.truncated_normal(key, -2.0, 2.0, (64, 4, 16)),
    "split": jax.random.key_data(jax.random.split(key, 7)),
}
hlo = jax.jit(lambda k: jax.random.bits(k, (1000,))).lower(key).compile().as_text()
print(json.dumps({"loops": " while(" in hlo, "digests": {
    name: hashlib.sha256(np.asarray(value).tobytes()).hexdigest()
    for name, value in draws.items()}}))
"""


def _draws(mode: str) -> dict:
  """DRAWS's output, from a fresh CPU process with the lowering `mode`."""
  out = subprocess.run([sys.executable, "-c", DRAWS, mode], check=True, capture_output=True,
                       text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  return json.loads(out.stdout.strip().splitlines()[-1])


def _compiled_bits_loop() -> bool:
  """Whether this process compiles a CPU draw of random bits with a loop."""
  hlo = jax.jit(lambda k: jax.random.bits(k, (999,))).lower(jax.random.key(1)).compile()
  return " while(" in hlo.as_text()


@pytest.mark.parametrize("key,count,expected", KNOWN_ANSWERS)
def test_hash_gives_the_known_answers(key, count, expected):
  words = prng.threefry2x32(*(np.asarray([w], np.uint32) for w in (*key, *count)))
  assert [int(w[0]) for w in words] == list(expected)


@pytest.mark.parametrize("key,count,expected", KNOWN_ANSWERS)
def test_registered_lowering_gives_the_known_answers(key, count, expected):
  prng.lower_threefry_unrolled_on_cpu()
  got = jax.jit(jax.extend.random.threefry_2x32)(np.asarray(key, np.uint32),
                                                 np.asarray(count, np.uint32))
  assert [int(w) for w in got] == list(expected)


def test_draws_equal_those_of_jax_own_lowering_without_its_loop():
  rolled, unrolled = _draws("rolled"), _draws("unrolled")
  assert rolled["loops"] and not unrolled["loops"]
  assert unrolled["digests"] == rolled["digests"]


STARTS_A_PROGRAM = """
import jax
from absl import flags
import relpos.train
from relpos import cli
loops = lambda: " while(" in jax.jit(lambda k: jax.random.bits(k, (999,))).lower(
    jax.random.key(1)).compile().as_text()
after_import = loops()
flags.FLAGS(["program"])
cli.start("")
print(after_import, loops())
"""


def test_a_program_start_registers_it_and_an_import_does_not():
  out = subprocess.run([sys.executable, "-c", STARTS_A_PROGRAM], check=True, capture_output=True,
                       text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert out.stdout.split() == ["True", "False"]
