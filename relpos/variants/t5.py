"""The T5 relative bias (Raffel et al. 2020): one learned scalar per head per bucket of
distances; bidirectional buckets in the encoder, causal ones in the decoder."""
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from relpos import fields
from relpos import positions as positions_lib
from relpos.variants import interface


class T5RelativeBias(interface.AttentionPosition):
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
        positions_lib.relative_positions(query_positions,
                                         key_positions), bidirectional=self.bidirectional,
        num_buckets=self.num_buckets, max_distance=self.max_distance)
    return jnp.moveaxis(self.embedding[...][buckets], -1, -3)

  def check_layer(self, num_heads: int, head_dim: int) -> None:
    if self.num_heads != num_heads:
      raise ValueError(f"the T5 bias has num_heads={self.num_heads}; the layer has "
                       f"num_heads={num_heads}.")

  def terms(self, query_positions: jax.Array, key_positions: jax.Array) -> interface.AttentionTerms:
    return interface.AttentionTerms(bias=self(query_positions, key_positions))

  def add_statistics(self, statistics: dict[str, Any], query: jax.Array, valid: np.ndarray) -> None:
    """"t5_bias": the first layer's bias table [buckets][heads] (the encoder's, bidirectional
    buckets)."""
    del query, valid
    statistics.setdefault("t5_bias", np.asarray(self.embedding[...]).tolist())


@interface.register("t5")
class T5(interface.Variant):
  """The T5 bias in encoder and decoder self-attention."""
  fields = {
      "t5_num_buckets": fields.Field(32, fields.integer(4),
                                     "buckets in all (the encoder's half each direction)"),
      "t5_max_distance": fields.Field(128, fields.integer(1),
                                      "distances from here on share the last bucket"),
      "t5_shared_across_layers": fields.Field(True, fields.BOOLEAN,
                                              "one bias per stack (T5) or one per layer"),
  }

  @classmethod
  def check(cls, config) -> None:
    # The encoder's buckets need num_buckets >= 4 (the field's rule), the decoder's (causal)
    # max_distance above num_buckets // 2 exact distances (`positions.t5_relative_position_bucket`).
    if config.t5_max_distance <= config.t5_num_buckets // 2:
      raise fields.invalid(
          "model.t5_max_distance", config.t5_max_distance,
          f"an integer > model.t5_num_buckets // 2 = "
          f"{config.t5_num_buckets // 2}")

  def self_attention(self, num_layers: int, *, causal: bool,
                     rngs: nnx.Rngs) -> list[T5RelativeBias]:
    def bias() -> T5RelativeBias:
      return T5RelativeBias(self.config.num_heads, num_buckets=self.config.t5_num_buckets,
                            max_distance=self.config.t5_max_distance, bidirectional=not causal,
                            rngs=rngs)

    if self.config.t5_shared_across_layers:
      return [bias()] * num_layers
    return [bias() for _ in range(num_layers)]
