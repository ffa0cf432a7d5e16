"""SHAPE (Kiyono et al. 2021, "SHAPE: Shifted Absolute Position Embedding for Transformers"):
absolute encodings of positions shifted by a random offset in training.

In training each sequence (each packed segment) of each stack draws k ~ U{0, ..., K} and is
encoded at positions k, k + 1, ..., k + n - 1; at evaluation and in decoding k = 0, which is
the plain `absolute` variant. The shift makes absolute positions uninformative, so the model
learns from differences of positions (shift invariance) with APE's cost. Encoder and decoder
draw their offsets independently. K = `model.shape_max_shift`; the encoding is
`model.absolute_type` (sinusoidal or t2t_timing_signal: fixed, defined at every position).
"""
import jax
from flax import nnx

from relpos import fields
from relpos import positions as positions_lib
from relpos.variants import absolute
from relpos.variants import interface


class ShiftedEncoding(interface.StochasticEmbedding):
  """Fixed absolute encodings, at positions shifted per segment in training."""
  def __init__(self, absolute_type: str, dim: int, max_shift: int, *, rngs: nnx.Rngs):
    self.absolute_type = absolute_type
    self.dim = dim
    self.max_shift = max_shift
    self.rngs = rngs.dropout.fork()

  def __call__(self, positions: jax.Array, *, deterministic: bool) -> jax.Array:
    """Encodings float32 [batch, n, dim] of positions int32 [batch, n]."""
    if not deterministic:
      positions = positions_lib.shifted_positions(self.rngs(), positions, self.max_shift)
    return absolute.FIXED_ENCODINGS[self.absolute_type](positions, self.dim)


def check_fixed_encoding(config, variant: str) -> None:
  """Rules of a variant that draws positions beyond the table: a fixed, even encoding."""
  if config.absolute_type not in absolute.FIXED_ENCODINGS:
    raise fields.invalid(
        "model.absolute_type", config.absolute_type,
        f"one of {', '.join(map(repr, absolute.FIXED_ENCODINGS))} under "
        f"model.position={variant!r}")
  absolute.check_encoding(config)


@interface.register("shape")
class Shape(interface.Variant):
  """Shifted absolute encodings added to the embeddings; nothing inside attention."""
  fields = {
      **absolute.ENCODING_FIELDS, "shape_max_shift": fields.Field(
          500, fields.integer(0), "K: training offsets are drawn from 0..K")
  }

  @classmethod
  def check(cls, config) -> None:
    check_fixed_encoding(config, cls.name)

  def embedding(self, *, rngs: nnx.Rngs) -> ShiftedEncoding:
    return ShiftedEncoding(self.config.absolute_type, self.config.emb_dim,
                           self.config.shape_max_shift, rngs=rngs)
