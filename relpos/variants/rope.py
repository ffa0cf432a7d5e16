"""Rotary position embeddings (Su et al. 2021): queries and keys rotated by their positions, so
that their dot product depends on the distance alone. No parameters."""
import jax
from flax import nnx

from relpos import fields
from relpos import positions as positions_lib
from relpos.variants import interface


class Rotary(interface.AttentionPosition):
  """Rotates queries and keys (`relpos.positions.apply_rope`, rotate-half layout)."""
  def __init__(self, base: float):
    self.base = base

  def check_layer(self, num_heads: int, head_dim: int) -> None:
    if head_dim % 2:
      raise ValueError(f"rope needs an even head dim (qkv_dim / num_heads), got {head_dim}.")

  def queries_and_keys(self, query: jax.Array, key: jax.Array, query_positions: jax.Array,
                       key_positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    return (positions_lib.apply_rope(query, query_positions, self.base),
            positions_lib.apply_rope(key, key_positions, self.base))


@interface.register("rope")
class Rope(interface.Variant):
  """Rotary embeddings in encoder and decoder self-attention."""
  fields = {
      "rope_base": fields.Field(
          10000.0, fields.number(0.0, open_min=True),
          "the base b: dimension pair i of d turns by b^(-2i/d) per position")
  }

  @classmethod
  def check(cls, config) -> None:
    if config.head_dim % 2:
      raise fields.invalid(
          "model.qkv_dim", config.qkv_dim,
          f"a multiple of 2 * model.num_heads={2 * config.num_heads} under "
          f"model.position='rope' (even head dim)")

  def self_attention(self, num_layers: int, *, causal: bool, rngs: nnx.Rngs) -> list[Rotary]:
    del causal, rngs
    return [Rotary(self.config.rope_base)] * num_layers
