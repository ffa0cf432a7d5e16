"""Relative position representations (Shaw et al. 2018): learned tables a^K and a^V.

Row r of each table (2k+1 rows) is the vector of clipped distance r - k; query i reads row
clip(j - i, -k, k) + k for key j, in the logits (a^K) and in the values (a^V). The tables are
shared across heads unless `relative_per_head`, and are one per layer unless
`relative_shared_across_layers` (then one for the whole model, encoder and decoder). The kernel
is `relpos.kernels.relative`.
"""
from typing import Any

import jax
import numpy as np
from flax import nnx

from relpos import fields
from relpos.kernels import distances as distances_lib
from relpos.variants import absolute
from relpos.variants import interface


class RelativePositionTables(interface.AttentionPosition):
  """The learned Shaw et al. tables a^K and a^V, (2k+1) rows each.

  One instance may be shared by several attention layers (NNX shared references).

  Attributes:
    max_distance: the clipping distance k.
    depth: the per-head depth of each row.
    num_heads: None (tables shared across heads) or the number of heads (one table per head).
    rel_key: nnx.Param [2k+1, depth] or [heads, 2k+1, depth], or None when a^K is off.
    rel_value: the same for a^V.
  """
  def __init__(self, max_distance: int, depth: int, *, num_heads: int | None = None,
               use_key: bool = True, use_value: bool = True, rngs: nnx.Rngs):
    if not isinstance(max_distance, int) or max_distance < 0:
      raise ValueError(f"max_distance must be an integer >= 0, got {max_distance!r}.")
    if depth < 1:
      raise ValueError(f"depth must be >= 1, got {depth}.")
    if num_heads is not None and num_heads < 1:
      raise ValueError(f"num_heads must be None (shared) or >= 1, got {num_heads}.")
    if not (use_key or use_value):
      raise ValueError("use_key and use_value are both False: relative attention needs a^K or "
                       "a^V (use position 'none' for neither).")
    self.max_distance = max_distance
    self.depth = depth
    self.num_heads = num_heads
    shape = (2 * max_distance + 1, depth)
    if num_heads is not None:
      shape = (num_heads, *shape)
    init = nnx.initializers.normal(stddev=depth**-0.5)
    self.rel_key = nnx.Param(init(rngs.params(), shape)) if use_key else None
    self.rel_value = nnx.Param(init(rngs.params(), shape)) if use_value else None

  def check_layer(self, num_heads: int, head_dim: int) -> None:
    if self.depth != head_dim or self.num_heads not in (None, num_heads):
      raise ValueError(f"relative tables (depth={self.depth}, num_heads={self.num_heads}) must "
                       f"have depth {head_dim} (qkv_dim / num_heads) and num_heads None or "
                       f"{num_heads}.")

  def terms(self, query_positions: jax.Array, key_positions: jax.Array) -> interface.AttentionTerms:
    del query_positions, key_positions  # the kernel reads the tables at these positions
    return interface.AttentionTerms(
        rel_key=None if self.rel_key is None else self.rel_key[...],
        rel_value=None if self.rel_value is None else self.rel_value[...],
        max_distance=self.max_distance)

  def add_statistics(self, statistics: dict[str, Any], query: jax.Array, valid: np.ndarray) -> None:
    """With a^K: appends this layer's row of "qak_by_offset" ([layer][2k+1]: the mean over
    tokens and heads of the logit a^K adds at offset d = -k..k, q_i . a^K[d] / sqrt(depth))
    and sets "max_distance" (k)."""
    if self.rel_key is None:
      return
    k = self.max_distance
    # The kernel's a^K logit of each query at each offset: [batch, heads, n, 2k+1]
    scaled = distances_lib.heads_first(query) * query.shape[-1]**-0.5
    logits = distances_lib.logits_per_distance(scaled, self.rel_key[...])
    logits = np.ascontiguousarray(np.moveaxis(np.asarray(logits), 1, 2))  # [batch, n, heads, 2k+1]
    mean = (logits * valid[:, :, None, None]).sum((0, 1, 2)) / (valid.sum() * logits.shape[2])
    statistics.setdefault("qak_by_offset", []).append(mean.tolist())
    statistics["max_distance"] = k


@interface.register("relative")
class Relative(interface.Variant):
  """Shaw et al. tables in encoder and decoder self-attention (never cross-attention)."""
  fields = {
      "add_absolute": fields.Field(False, fields.BOOLEAN,
                                   "also add absolute encodings (model.absolute_type)"),
      **absolute.ENCODING_FIELDS,  # absolute + relative: Shaw et al.'s combination
      "max_relative_position": fields.Field(16, fields.integer(0),
                                            "k: distances clipped to [-k, k]"),
      "relative_key": fields.Field(True, fields.BOOLEAN, "a^K"),
      "relative_value": fields.Field(True, fields.BOOLEAN, "a^V"),
      "relative_per_head": fields.Field(False, fields.BOOLEAN,
                                        "one table per head (default: shared across heads)"),
      "relative_shared_across_layers": fields.Field(
          False, fields.BOOLEAN, "one table for every layer (default: one per layer)"),
  }

  @classmethod
  def check(cls, config) -> None:
    if config.add_absolute:
      absolute.check_encoding(config)
    elif config.absolute_type != absolute.ENCODING_FIELDS["absolute_type"].default:
      raise fields.invalid(  # else the run records an encoding it never had
          "model.absolute_type", config.absolute_type,
          f"{absolute.ENCODING_FIELDS['absolute_type'].default!r} unless model.add_absolute=True "
          "(relative attention alone adds no absolute encoding)")
    if not (config.relative_key or config.relative_value):
      raise fields.invalid(
          "model.relative_key", config.relative_key,
          "True when model.relative_value=False under model.position="
          "'relative' (a^K and a^V cannot both be off; use position='none' "
          "for neither)")

  @classmethod
  def value_table_field(cls, config) -> str | None:
    return "relative_value" if config.relative_value else None

  def __init__(self, config):
    super().__init__(config)
    self._shared_tables = None

  def _tables(self, rngs: nnx.Rngs) -> RelativePositionTables:
    config = self.config
    return RelativePositionTables(config.max_relative_position, config.head_dim,
                                  num_heads=config.num_heads if config.relative_per_head else None,
                                  use_key=config.relative_key, use_value=config.relative_value,
                                  rngs=rngs)

  def embedding(self, *, rngs: nnx.Rngs) -> absolute.AbsolutePositionEncoding | None:
    return absolute.encoding(self.config, rngs) if self.config.add_absolute else None

  def self_attention(self, num_layers: int, *, causal: bool,
                     rngs: nnx.Rngs) -> list[RelativePositionTables]:
    del causal  # the same tables serve both directions: distances are signed
    if not self.config.relative_shared_across_layers:
      return [self._tables(rngs) for _ in range(num_layers)]
    if self._shared_tables is None:
      self._shared_tables = self._tables(rngs)
    return [self._shared_tables] * num_layers
