"""The interface of a position variant, and the registry of variants by name.

A variant is a `Variant` subclass registered under the name `model.position` selects. The model
asks it three things (and the config check, for a fused kernel, `value_table_field`):

  fields / check   its own `model.*` config fields (default, rule, doc) and the rules between
                   them and the rest of the model (only the selected variant's are in a run's
                   config; a variant built on another lists that one's fields too, the same
                   `Field` objects);
  embedding        a module whose output [batch or 1, n, emb_dim] is added to the token
                   embeddings of each stack (absolute encodings), or None; a
                   `StochasticEmbedding` is also told whether it is training;
  self_attention   for one stack (the encoder: causal=False; the decoder: causal=True), one
                   `AttentionPosition` (or None) per layer. Returning the same instance for
                   several layers, or to both stacks, shares its parameters (NNX shared
                   references, as flaxformer shares a relative-attention module).

An `AttentionPosition` acts inside one self-attention layer (cross-attention never sees
positions): it may transform the projected queries and keys (`queries_and_keys`: RoPE) and add
`AttentionTerms` to the kernel (a logit bias: T5, ALiBi; Shaw et al.'s a^K / a^V tables). The
layer calls it alike in a full pass and in a cached decode step; in a step the query is the one
token at position `cache_index`, its key is transformed at that position before it is written
to the cache, and the terms are computed against every cache slot (later slots are masked).
It may also report what its position term learned (`add_statistics`, read by
`relpos.attention_statistics`).
"""
import dataclasses
import re
import sys
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

import jax
import numpy as np
from flax import nnx

from relpos import fields as fields_lib


@dataclasses.dataclass(frozen=True)
class AttentionTerms:
  """What a variant adds to one attention call (see `relpos.kernels.relative`).

  Attributes:
    bias: None, or float32 [q_len, kv_len] or [batch or 1, heads or 1, q_len, kv_len], added
      to the logits.
    rel_key: None, or the a^K table [2k+1, depth] or [heads, 2k+1, depth] (row r: distance
      r - k, read at clip(key position - query position, -k, k)).
    rel_value: the same for a^V, added to the values.
    max_distance: k of the tables.
  """
  bias: jax.Array | None = None
  rel_key: jax.Array | None = None
  rel_value: jax.Array | None = None
  max_distance: int = 0

  def kernel_arguments(self) -> dict[str, Any]:
    """Keyword arguments of `relative_dot_product_attention`."""
    return {
        "bias": self.bias, "rel_key": self.rel_key, "rel_value": self.rel_value,
        "max_distance": self.max_distance
    }


class AttentionPosition(nnx.Module):
  """What a variant does inside one self-attention layer; this base class does nothing.

  Positions are int32 [batch or 1, q_len] and [batch or 1, kv_len] (restarting per packed
  segment), queries and keys [batch, len, heads, head_dim] in the compute dtype.
  """
  def check_layer(self, num_heads: int, head_dim: int) -> None:
    """Raises ValueError if this module cannot serve a layer of this shape."""

  def queries_and_keys(self, query: jax.Array, key: jax.Array, query_positions: jax.Array,
                       key_positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The projected queries and keys, transformed by position (same shapes and dtype)."""
    del query_positions, key_positions
    return query, key

  def terms(self, query_positions: jax.Array, key_positions: jax.Array) -> AttentionTerms:
    """The bias and tables of the attention call."""
    del query_positions, key_positions
    return AttentionTerms()

  def add_statistics(self, statistics: dict[str, Any], query: jax.Array, valid: np.ndarray) -> None:
    """Adds what this layer's position term learned to an encoder's `statistics`.

    `relpos.attention_statistics.position_statistics` calls it once per encoder layer, in
    order, on a batch of source sentences at positions 0..n-1, and stores the statistics (JSON
    values: lists, numbers) in the run's result.json; this base adds nothing.

    Args:
      statistics: the statistics so far (the earlier layers' included); add or append under
        names of this variant's own.
      query: the layer's projected queries [batch, n, heads, head_dim] (before
        `queries_and_keys`).
      valid: bool [batch, n], True on tokens.
    """
    del statistics, query, valid


class StochasticEmbedding(nnx.Module):
  """A position embedding that draws random numbers in training (SHAPE, randomized positions).

  The model calls it as `module(positions, deterministic=...)` with positions int32
  [batch, n] (broadcast to the batch, restarting at 0 per packed segment); any other embedding
  module is called as `module(positions)`. With deterministic=True (evaluation, decoding) it
  must depend on each position alone, so that cached decoding equals the full pass.
  """
  def __call__(self, positions: jax.Array, *, deterministic: bool) -> jax.Array:
    """Encodings [batch, n, emb_dim] of positions int32 [batch, n]."""
    raise NotImplementedError


class Variant:
  """A position variant, built once per model from its `TransformerConfig`.

  Subclasses declare `fields` and override what they add; this base adds nothing (the 'none'
  variant). Read options as attributes of `self.config` (e.g. `self.config.rope_base`).

  Attributes:
    name: the registered name (set by `register`).
    fields: its own `model.<name>` config fields.
    config: the model's TransformerConfig.
  """
  name: ClassVar[str] = ""
  fields: ClassVar[Mapping[str, fields_lib.Field]] = {}

  def __init__(self, config: Any):
    self.config = config

  @classmethod
  def check(cls, config: Any) -> None:
    """Rules between this variant's fields and the model's, for a model that selects it.
    Raise `relpos.fields.invalid("model.<field>", value, allowed)`."""

  @classmethod
  def value_table_field(cls, config: Any) -> str | None:
    """The field of this variant that adds a table to the attention values (a^V) in `config`,
    or None when it adds none (fused kernels such as cuDNN's cannot add one)."""
    del config
    return None

  def embedding(self, *, rngs: nnx.Rngs) -> nnx.Module | None:
    """A module mapping positions [batch or 1, n] to [batch or 1, n, emb_dim], added to the
    token embeddings of a stack (called once per stack), or None."""
    del rngs
    return None

  def self_attention(self, num_layers: int, *, causal: bool,
                     rngs: nnx.Rngs) -> list[AttentionPosition | None]:
    """One entry per self-attention layer of a stack (the decoder's is causal)."""
    del causal, rngs
    return [None] * num_layers


_REGISTRY: dict[str, type[Variant]] = {}
V = TypeVar("V", bound=type[Variant])


def _same_field(a: fields_lib.Field, b: fields_lib.Field) -> bool:
  """Whether two declarations are one field: the same `Field` object (a variant built on
  another lists its fields), or an equal declaration (default, rule's words, doc, absent,
  effect: a module run again declares its fields anew)."""
  declared = lambda f: (f.default, f.rule.allowed, f.doc, f.absent, f.effect)
  return a is b or declared(a) == declared(b)


def register(name: str) -> Callable[[V], V]:
  """Class decorator: registers a `Variant` subclass as `model.position=<name>`.

  A class of the same module and name registers again in its place (a module imported
  again, a notebook cell run again).

  Raises:
    ValueError: a name that is not letters, digits and underscores (it becomes a table row in
      `--rows` and a folder name; "k=3" would pass for a row of the k sweep), a name taken by
      another class, a field that is not a `relpos.fields.Field`, or a field another variant
      declares.
  """
  if not re.fullmatch(r"[A-Za-z0-9_]+", name):
    raise ValueError(f"position variant name {name!r}: use letters, digits and underscores "
                     "only (it names a table row and its runs' folders).")

  def decorate(cls: V) -> V:
    if not (isinstance(cls, type) and issubclass(cls, Variant)):
      raise ValueError(f"variant {name!r}: {cls!r} is not a relpos.variants.Variant subclass.")
    for field, declared in cls.fields.items():
      if not isinstance(declared, fields_lib.Field):
        raise ValueError(f"variant {name!r}: fields[{field!r}] is {declared!r}, not a "
                         f"relpos.fields.Field(default, rule, doc).")
    registered = _REGISTRY.get(name, cls)
    if (registered.__module__, registered.__qualname__) != (cls.__module__, cls.__qualname__):
      raise ValueError(f"position variant {name!r} is already registered "
                       f"({registered.__module__}.{registered.__qualname__}); give "
                       f"{cls.__qualname__} a name of its own.")
    for other in _REGISTRY.values():
      taken = {
          field for field in set(other.fields) & set(cls.fields)
          if not _same_field(other.fields[field], cls.fields[field])
      }
      if other.name != name and taken:
        raise ValueError(f"variant {name!r}: field model.{sorted(taken)[0]} is already a field "
                         f"of variant {other.name!r}.")
    cls.name = name
    _REGISTRY[name] = cls
    return cls

  return decorate


def names() -> tuple[str, ...]:
  """The registered variant names, in registration order."""
  return tuple(_REGISTRY)


def get(name: str) -> type[Variant]:
  """The variant class registered as `name`.

  Raises:
    ValueError: an unknown name, listing the registered ones.
  """
  if name not in _REGISTRY:
    raise ValueError(f"unknown position variant {name!r}; registered: {', '.join(_REGISTRY)} "
                     f"(a variant of your own: --import=<its module>).")
  return _REGISTRY[name]


def all_fields() -> dict[str, fields_lib.Field]:
  """The `model.*` fields of every registered variant."""
  return {name: field for cls in _REGISTRY.values() for name, field in cls.fields.items()}


def origin(variant: type[Variant]) -> str:
  """Where a variant's code comes from: its module's file, else its module's name."""
  return getattr(sys.modules.get(variant.__module__), "__file__", None) or variant.__module__


def owner(field: str) -> str:
  """The name of the first registered variant that declares `model.<field>`."""
  return next(cls.name for cls in _REGISTRY.values() if field in cls.fields)
