"""FIRE (Li et al. 2023): attention bias from a learned function of the normalized log distance.

  bias[h, i, j] = mlp(log(c |j - i| + 1) / log(c max(L, i) + 1))[h]

with c > 0 learned, L = model.fire_threshold and a one-hidden-layer MLP per self-attention
layer, one output per head (the decoder is causal through its mask; the paper's causal form
uses i - j >= 0, here |j - i| serves the encoder too). Train it with
`python train.py --import=examples/fire.py --config.model.position=fire --workdir=...`.
"""
import jax
import jax.numpy as jnp
from flax import nnx

from relpos import fields
from relpos import positions
from relpos import variants


class FireBias(variants.AttentionPosition):
  """One layer's FIRE bias: parameters log_c, and the MLP 1 -> hidden -> heads."""

  def __init__(self, num_heads: int, hidden: int, threshold: int, *, rngs: nnx.Rngs):
    self.num_heads = num_heads
    self.threshold = threshold
    self.log_c = nnx.Param(jnp.zeros(()))
    self.hidden = nnx.Linear(1, hidden, rngs=rngs)
    self.out = nnx.Linear(hidden, num_heads, rngs=rngs)

  def check_layer(self, num_heads: int, head_dim: int) -> None:
    if num_heads != self.num_heads:
      raise ValueError(f"FIRE has {self.num_heads} heads; the layer has {num_heads}.")

  def terms(self, query_positions: jax.Array,
            key_positions: jax.Array) -> variants.AttentionTerms:
    c = jnp.exp(self.log_c[...])
    distance = jnp.abs(positions.relative_positions(query_positions, key_positions))  # [b, q, k]
    scale = jnp.maximum(query_positions, self.threshold)[..., :, None]  # [b, q, 1]
    normalized = jnp.log1p(c * distance) / jnp.log1p(c * scale)  # [b, q, k]
    bias = self.out(nnx.relu(self.hidden(normalized[..., None])))  # [b, q, k, heads]
    return variants.AttentionTerms(bias=jnp.moveaxis(bias, -1, 1))  # [b, heads, q, k]


@variants.register("fire")
class Fire(variants.Variant):
  """FIRE in encoder and decoder self-attention, one MLP per layer."""
  fields = {
      "fire_hidden": fields.Field(32, fields.integer(1), "width of the MLP's hidden layer"),
      "fire_threshold": fields.Field(16, fields.integer(1),
                                     "L: queries before position L share its normalization"),
  }

  def self_attention(self, num_layers: int, *, causal: bool,
                     rngs: nnx.Rngs) -> list[FireBias]:
    del causal  # the decoder's mask hides later keys
    return [FireBias(self.config.num_heads, self.config.fire_hidden, self.config.fire_threshold,
                     rngs=rngs) for _ in range(num_layers)]
