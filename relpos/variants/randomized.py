"""Randomized positional encodings (Ruoss et al. 2023, "Randomized Positional Encodings Boost
Length Generalization of Transformers") on sinusoidal absolute encodings.

In training, each sequence (each packed segment) of m tokens of each stack is encoded at a
sorted subset of m positions drawn uniformly from range(L), L = `model.randomized_max_position`
larger than any sequence (the paper's experiments: N = 40 training tokens, tests up to 500,
L = 2048, the default here). The model sees every position below L in training and can only
rely on their order, so a longer test sequence is in distribution.

At evaluation and in decoding, positions are deterministic: stride * (0, 1, ..., n - 1) with
stride = `model.randomized_eval_stride` (default 1: 0..n-1). The paper's reference code
(google-deepmind/randomized_positional_encodings) also samples at test time; relpos does not,
because beam search with a cache must give the same positions to a step as the full pass and
be reproducible, which a map of each position alone does. A stride near L / (N + 1) puts test
spacings at the mean spacing of training. The paper randomizes sin/cos, learned, relative,
RoPE and ALiBi encodings alike; relpos randomizes the fixed absolute encoding of
`model.absolute_type` (sinusoidal or t2t_timing_signal), which both stacks of an
encoder-decoder carry and which is defined at every position below L.
"""
import jax
from absl import logging
from flax import nnx

from relpos import fields
from relpos import positions as positions_lib
from relpos.variants import absolute
from relpos.variants import interface
from relpos.variants import shape

# (eval stride, L, max_len) settings already warned about in this process.
_WARNED: set[tuple[int, int, int]] = set()


class RandomizedEncoding(interface.StochasticEmbedding):
  """Fixed absolute encodings at sorted random positions in training, stride * i otherwise."""
  def __init__(self, absolute_type: str, dim: int, max_position: int, eval_stride: int, *,
               rngs: nnx.Rngs):
    self.absolute_type = absolute_type
    self.dim = dim
    self.max_position = max_position
    self.eval_stride = eval_stride
    self.rngs = rngs.dropout.fork()

  def __call__(self, positions: jax.Array, *, deterministic: bool) -> jax.Array:
    """Encodings float32 [batch, n, dim] of positions int32 [batch, n]."""
    if deterministic:
      return absolute.FIXED_ENCODINGS[self.absolute_type](positions * self.eval_stride, self.dim)
    if positions.shape[-1] > self.max_position:
      raise ValueError(f"sequence length {positions.shape[-1]} exceeds "
                       f"model.randomized_max_position={self.max_position}.")
    sampled = positions_lib.random_sorted_positions(self.rngs(), positions, self.max_position)
    return absolute.FIXED_ENCODINGS[self.absolute_type](sampled, self.dim)


@interface.register("randomized")
class Randomized(interface.Variant):
  """Randomized absolute encodings added to the embeddings; nothing inside attention."""
  fields = {
      **absolute.ENCODING_FIELDS,
      "randomized_max_position": fields.Field(
          2048, fields.integer(1), "L: training positions are drawn from 0..L-1 (>= max_len)"),
      "randomized_eval_stride": fields.Field(1, fields.integer(1),
                                             "evaluation positions are stride * (0, 1, ...)"),
  }

  @classmethod
  def check(cls, config) -> None:
    shape.check_fixed_encoding(config, cls.name)
    if config.randomized_max_position < config.max_len:
      raise fields.invalid("model.randomized_max_position", config.randomized_max_position,
                           f"an integer >= model.max_len={config.max_len}")
    in_range = -(-config.randomized_max_position // config.randomized_eval_stride)
    settings = (config.randomized_eval_stride, config.randomized_max_position, config.max_len)
    if in_range < config.max_len and settings not in _WARNED:
      _WARNED.add(settings)  # once per process: a config is checked wherever it is built
      logging.warning(
          "model.randomized_eval_stride=%d puts evaluation position %d at %d, past "
          "model.randomized_max_position=%d: a sequence longer than %d tokens (of up to "
          "model.max_len=%d) is evaluated at positions training never draws.",
          config.randomized_eval_stride, in_range, in_range * config.randomized_eval_stride,
          config.randomized_max_position, in_range, config.max_len)

  def embedding(self, *, rngs: nnx.Rngs) -> RandomizedEncoding:
    config = self.config
    return RandomizedEncoding(config.absolute_type, config.emb_dim, config.randomized_max_position,
                              config.randomized_eval_stride, rngs=rngs)
