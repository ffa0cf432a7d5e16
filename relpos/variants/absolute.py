"""Absolute position encodings added to the token embeddings (Vaswani et al. 2017).

`absolute_type` chooses sinusoidal encodings with the paper's frequencies, tensor2tensor's
timing signal (what Shaw et al. trained with), or a learned [max_len, emb_dim] table.
"""
import jax
import jax.numpy as jnp
from flax import nnx

from relpos import fields
from relpos import positions as positions_lib
from relpos.variants import interface

# absolute_type -> fixed encoding (positions [..., n], dim) -> [..., n, dim].
FIXED_ENCODINGS = {
    "sinusoidal": positions_lib.sinusoidal_position_encoding,
    "t2t_timing_signal": positions_lib.t2t_timing_signal
}
ABSOLUTE_TYPES = ("sinusoidal", "learned", "t2t_timing_signal")


class AbsolutePositionEncoding(nnx.Module):
  """Absolute encodings of token positions: a fixed encoding of `FIXED_ENCODINGS` or a learned
  [max_len, dim] table."""
  def __init__(self, absolute_type: str, dim: int, max_len: int, *, rngs: nnx.Rngs):
    self.dim = dim
    self.absolute_type = absolute_type
    self.max_len = max_len
    self.table = (nnx.Param(nnx.initializers.normal(
        stddev=0.02)(rngs.params(), (max_len, dim))) if absolute_type == "learned" else None)

  def __call__(self, positions: jax.Array) -> jax.Array:
    """Encodings [batch or 1, n, dim] of integer positions [batch or 1, n]."""
    if self.table is None:
      return FIXED_ENCODINGS[self.absolute_type](positions, self.dim)
    if positions.shape[-1] > self.max_len:
      raise ValueError(f"a sequence of {positions.shape[-1]} tokens is longer than the learned "
                       f"absolute table (model.absolute_type='learned', model.max_len="
                       f"{self.max_len}): set a larger model.max_len, or sinusoidal encodings.")
    return jnp.take(self.table[...], positions, axis=0)


def check_encoding(config) -> None:
  """The model's rules for absolute encodings (an even emb_dim for the fixed ones)."""
  if config.absolute_type != "learned" and config.emb_dim % 2:
    raise fields.invalid("model.emb_dim", config.emb_dim, "even for sinusoidal absolute encodings")


def encoding(config, rngs: nnx.Rngs) -> AbsolutePositionEncoding:
  """The absolute encoding of `config.absolute_type` for one stack."""
  return AbsolutePositionEncoding(config.absolute_type, config.emb_dim, config.max_len, rngs=rngs)


# The fields of an absolute encoding; a variant that adds one lists them among its own.
ENCODING_FIELDS = {
    "absolute_type": fields.Field("sinusoidal", fields.one_of(*ABSOLUTE_TYPES),
                                  "sinusoidal | t2t_timing_signal | learned")
}


@interface.register("absolute")
class Absolute(interface.Variant):
  """Encodings of each token's position added to its embedding; nothing inside attention."""
  fields = ENCODING_FIELDS

  @classmethod
  def check(cls, config) -> None:
    check_encoding(config)

  def embedding(self, *, rngs: nnx.Rngs) -> AbsolutePositionEncoding:
    return encoding(self.config, rngs)
