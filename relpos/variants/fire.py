"""FIRE (Li et al. 2023, "Functional Interpolation for Relative Positions Improves Long Context
Transformers"): an attention bias from a learned function of the normalized log distance.

Causal (the paper's form, the decoder):

  bias[h, i, j] = f(psi(i - j) / psi(max(L, i)))[h],   psi(x) = log(c x + 1),

with f an MLP [2] -> hidden (ReLU) -> heads (its second input below), c > 0 and the threshold L
learned (progressive interpolation: queries before position L share the normalizer psi(L)). The
input lies in [0, 1] because i - j <= i for the keys a causal query sees.

Bidirectional (the encoder): keys right of the query have |i - j| > i, and the causal normalizer
psi(max(L, i)) gives inputs above 1 (log 40 / log 17 = 1.30 at i = 0, j = 39 with L = 16, c =
1), outside the bounded domain FIRE is built on. Here the normalizer is psi(max(L, i, j)): both
positions are distances to the sequence start and |i - j| <= max(i, j), so the input stays in
[0, 1] in both directions, reduces to the paper's max(L, i) wherever j <= i (the decoder sees
exactly the paper's FIRE), and depends on positions alone (cached decoding equals the full pass;
packed segments restart positions). The sequence length would also bound it but is unknown to a
cached decoding step. f gets a second input, x * [j > i], so an encoder layer can tell left from
right (always 0 in the decoder: its later keys are masked).
"""
import math

import jax
import jax.numpy as jnp
from flax import nnx

from relpos import fields
from relpos import positions as positions_lib
from relpos.variants import interface


class FireBias(interface.AttentionPosition):
  """One layer's FIRE bias.

  Attributes:
    log_c: nnx.Param [] (c = exp(log_c) > 0).
    threshold: nnx.Param [], L (used as max(L, 1)).
    hidden, out: the MLP [2] -> [hidden] -> [num_heads].
  """
  def __init__(self, num_heads: int, hidden: int, *, init_c: float, init_threshold: float,
               rngs: nnx.Rngs):
    self.num_heads = num_heads
    self.log_c = nnx.Param(jnp.asarray(math.log(init_c), jnp.float32))
    self.threshold = nnx.Param(jnp.asarray(init_threshold, jnp.float32))
    self.hidden = nnx.Linear(2, hidden, rngs=rngs)
    self.out = nnx.Linear(hidden, num_heads, rngs=rngs)

  def check_layer(self, num_heads: int, head_dim: int) -> None:
    if num_heads != self.num_heads:
      raise ValueError(f"the FIRE bias has num_heads={self.num_heads}; the layer has "
                       f"num_heads={num_heads}.")

  def normalized_distances(self, query_positions: jax.Array, key_positions: jax.Array) -> jax.Array:
    """psi(|i - j|) / psi(max(L, i, j)), float32 [batch or 1, q, k], in [0, 1]."""
    c = jnp.exp(self.log_c[...])
    threshold = jnp.maximum(self.threshold[...], 1.0)
    query = query_positions.astype(jnp.float32)[..., :, None]  # [b, q, 1]
    key = key_positions.astype(jnp.float32)[..., None, :]  # [b, 1, k]
    distance = jnp.abs(positions_lib.relative_positions(query_positions, key_positions))
    scale = jnp.maximum(threshold, jnp.maximum(query, key))  # [b, q, k]
    return jnp.log1p(c * distance.astype(jnp.float32)) / jnp.log1p(c * scale)

  def __call__(self, query_positions: jax.Array, key_positions: jax.Array) -> jax.Array:
    """The bias float32 [batch or 1, heads, q, k] of int positions [b or 1, q], [b or 1, k]."""
    normalized = self.normalized_distances(query_positions, key_positions)  # [b, q, k]
    right = (key_positions[..., None, :] > query_positions[..., :, None]).astype(jnp.float32)
    features = jnp.stack([normalized, normalized * right], axis=-1)  # [b, q, k, 2]
    bias = self.out(nnx.relu(self.hidden(features)))  # [b, q, k, heads]
    return jnp.moveaxis(bias, -1, -3)  # [b, heads, q, k]

  def terms(self, query_positions: jax.Array, key_positions: jax.Array) -> interface.AttentionTerms:
    return interface.AttentionTerms(bias=self(query_positions, key_positions))


@interface.register("fire")
class Fire(interface.Variant):
  """FIRE in encoder and decoder self-attention, one bias (c, L, MLP) per layer."""
  fields = {
      "fire_hidden": fields.Field(32, fields.integer(1), "width of the MLP's hidden layer"),
      "fire_init_c": fields.Field(0.1, fields.number(0.0, open_min=True),
                                  "initial c of psi(x) = log(c x + 1) (learned)"),
      "fire_init_threshold": fields.Field(16.0, fields.number(1.0),
                                          "initial L (learned): queries before L share psi(L)"),
  }

  def self_attention(self, num_layers: int, *, causal: bool, rngs: nnx.Rngs) -> list[FireBias]:
    del causal  # one form serves both: it is the paper's wherever j <= i
    config = self.config
    return [
        FireBias(config.num_heads, config.fire_hidden, init_c=config.fire_init_c,
                 init_threshold=config.fire_init_threshold, rngs=rngs) for _ in range(num_layers)
    ]
