"""ALiBi (Press et al. 2022): a bias -slope * |j - i| per head, with the paper's slopes; no
parameters. Causality comes from the decoder's mask."""
import jax
from flax import nnx

from relpos import positions as positions_lib
from relpos.variants import interface


class AlibiBias(interface.AttentionPosition):
  """The symmetric ALiBi bias of `relpos.positions.alibi_bias`."""
  def __init__(self, num_heads: int):
    self.num_heads = num_heads

  def check_layer(self, num_heads: int, head_dim: int) -> None:
    if self.num_heads != num_heads:
      raise ValueError(f"the ALiBi bias has num_heads={self.num_heads}; the layer has "
                       f"num_heads={num_heads}.")

  def terms(self, query_positions: jax.Array, key_positions: jax.Array) -> interface.AttentionTerms:
    slopes = positions_lib.alibi_slopes(self.num_heads)
    return interface.AttentionTerms(
        bias=positions_lib.alibi_bias(query_positions, key_positions, slopes))


@interface.register("alibi")
class Alibi(interface.Variant):
  """The ALiBi bias in encoder and decoder self-attention."""
  def self_attention(self, num_layers: int, *, causal: bool, rngs: nnx.Rngs) -> list[AlibiBias]:
    del causal, rngs
    return [AlibiBias(self.config.num_heads)] * num_layers
