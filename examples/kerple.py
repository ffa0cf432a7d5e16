"""KERPLE (Chi et al. 2022), its logarithmic form: a learned log-distance bias per head.

  bias[h, i, j] = -r1[h] * log(1 + r2[h] |j - i|)

with r1, r2 > 0 learned (as exp of parameters that start at 0). The decoder is causal through
its mask. Train it with
`python train.py --import=examples/kerple.py --config.model.position=kerple --workdir=...`.
"""
import jax
import jax.numpy as jnp
from flax import nnx

from relpos import fields
from relpos import positions
from relpos import variants


class KerpleBias(variants.AttentionPosition):
  """One KERPLE-log bias: parameters log_r1, log_r2 [heads]."""
  def __init__(self, num_heads: int):
    self.num_heads = num_heads
    self.log_r1 = nnx.Param(jnp.zeros((num_heads,)))
    self.log_r2 = nnx.Param(jnp.zeros((num_heads,)))

  def check_layer(self, num_heads: int, head_dim: int) -> None:
    if num_heads != self.num_heads:
      raise ValueError(f"KERPLE has {self.num_heads} heads; the layer has {num_heads}.")

  def terms(self, query_positions: jax.Array, key_positions: jax.Array) -> variants.AttentionTerms:
    distance = jnp.abs(positions.relative_positions(query_positions, key_positions))  # [b, q, k]
    r1 = jnp.exp(self.log_r1[...])[:, None, None]  # [heads, 1, 1]
    r2 = jnp.exp(self.log_r2[...])[:, None, None]
    bias = -r1 * jnp.log1p(r2 * distance[:, None].astype(jnp.float32))  # [b, heads, q, k]
    return variants.AttentionTerms(bias=bias)


@variants.register("kerple")
class Kerple(variants.Variant):
  """KERPLE-log in encoder and decoder self-attention."""
  fields = {
      "kerple_shared_across_layers": fields.Field(
          False, fields.BOOLEAN, "one bias for every layer of both stacks (default: one per layer)")
  }

  def self_attention(self, num_layers: int, *, causal: bool, rngs: nnx.Rngs) -> list[KerpleBias]:
    del causal, rngs  # the decoder's mask hides later keys; no random initialization
    if self.config.kerple_shared_across_layers:
      if not hasattr(self, "shared"):
        self.shared = KerpleBias(self.config.num_heads)
      return [self.shared] * num_layers
    return [KerpleBias(self.config.num_heads) for _ in range(num_layers)]
