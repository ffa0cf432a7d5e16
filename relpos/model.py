"""Encoder-decoder Transformer (Flax NNX) whose position information is chosen by config.

`TransformerConfig.position` selects the variant:

  absolute  sinusoidal (or learned) encodings of each token's position added to the embeddings
  relative  Shaw et al. (2018) tables a^K / a^V in encoder and decoder self-attention
            (optionally combined with absolute encodings via `add_absolute`)
  t5        T5 bucketed bias: bidirectional buckets in the encoder, causal ones in the decoder
  rope      rotary embeddings of queries and keys in self-attention
  alibi     linear distance bias in self-attention
  none      no position information at all

Parameters are float32; `dtype` ('float32', 'bfloat16', 'float16') is the compute dtype of
activations, matmuls and the decode cache, while layer-norm statistics, attention logits and
softmax, the output logits and the loss stay float32 (mixed precision as in t5x and flax's wmt
example). `attention_implementation` chooses the attention kernel ('auto', 'xla', 'cudnn').

Cross-attention never sees positions. Positions come from per-token position arrays (default
0..n-1), and attention masks from segment ids, so a packed batch gives the same outputs as its
sentences one by one. Token 0 is padding.
"""
import dataclasses
from typing import Any

from absl import logging

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from relpos import attention
from relpos import positions as positions_lib

PAD_ID = 0
POSITIONS = attention.POSITIONS
ABSOLUTE_TYPES = ("sinusoidal", "learned")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}

DecodeCache = list[attention.Cache]


def _is_int(value: Any) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _invalid(name: str, value: Any, allowed: str) -> ValueError:
  return ValueError(f"config field model.{name}={value!r} is invalid: must be {allowed}.")


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """Architecture of the Transformer: the `model.*` fields of configs/default.py + vocab_size.

  See configs/default.py for the meaning of each field. Every field is validated on
  construction.

  Raises:
    ValueError: naming the first invalid field (as config field model.<name>), its value and
      the allowed values.
  """
  vocab_size: int
  emb_dim: int
  num_heads: int
  qkv_dim: int
  mlp_dim: int
  num_encoder_layers: int
  num_decoder_layers: int
  dropout_rate: float
  attention_dropout_rate: float
  pre_layer_norm: bool
  share_embeddings: bool
  logits_via_embedding: bool
  max_len: int
  position: str
  absolute_type: str
  add_absolute: bool
  max_relative_position: int
  relative_key: bool
  relative_value: bool
  relative_per_head: bool
  relative_shared_across_layers: bool
  t5_num_buckets: int
  t5_max_distance: int
  t5_shared_across_layers: bool
  rope_base: float
  # Fields added after runs were published: a config.json without them takes these defaults.
  dtype: str = "float32"
  attention_implementation: str = "auto"

  def __post_init__(self):
    self._check_fields()
    self._check_combinations()

  def _check_fields(self) -> None:
    """Each field on its own: type and range."""
    for name in ("vocab_size", "emb_dim", "num_heads", "qkv_dim", "mlp_dim",
                 "num_encoder_layers", "num_decoder_layers", "max_len", "t5_num_buckets",
                 "t5_max_distance"):
      if not (_is_int(getattr(self, name)) and getattr(self, name) >= 1):
        raise _invalid(name, getattr(self, name), "an integer >= 1")
    if not (_is_int(self.max_relative_position) and self.max_relative_position >= 0):
      raise _invalid("max_relative_position", self.max_relative_position, "an integer >= 0")
    for name in ("dropout_rate", "attention_dropout_rate"):
      value = getattr(self, name)
      if not (isinstance(value, (int, float)) and not isinstance(value, bool)
              and 0.0 <= value < 1.0):
        raise _invalid(name, value, "a number in [0, 1)")
    for name in ("pre_layer_norm", "share_embeddings", "logits_via_embedding", "add_absolute",
                 "relative_key", "relative_value", "relative_per_head",
                 "relative_shared_across_layers", "t5_shared_across_layers"):
      if not isinstance(getattr(self, name), bool):
        raise _invalid(name, getattr(self, name), "True or False")
    if self.position not in POSITIONS:
      raise _invalid("position", self.position, f"one of {', '.join(map(repr, POSITIONS))}")
    if self.absolute_type not in ABSOLUTE_TYPES:
      raise _invalid("absolute_type", self.absolute_type,
                     f"one of {', '.join(map(repr, ABSOLUTE_TYPES))}")
    if not (isinstance(self.rope_base, (int, float)) and not isinstance(self.rope_base, bool)
            and self.rope_base > 0):
      raise _invalid("rope_base", self.rope_base, "a number > 0")
    if self.dtype not in DTYPES:
      raise _invalid("dtype", self.dtype, f"one of {', '.join(map(repr, DTYPES))}")
    if self.attention_implementation not in attention.IMPLEMENTATIONS:
      raise _invalid("attention_implementation", self.attention_implementation,
                     f"one of {', '.join(map(repr, attention.IMPLEMENTATIONS))}")

  def _check_combinations(self) -> None:
    """Rules between fields."""
    if self.qkv_dim % self.num_heads:
      raise _invalid("num_heads", self.num_heads,
                     f"a divisor of model.qkv_dim={self.qkv_dim}")
    if self.add_absolute and self.position != "relative":
      raise _invalid("add_absolute", self.add_absolute,
                     f"False unless model.position='relative' (position={self.position!r})")
    if self.uses_absolute and self.absolute_type == "sinusoidal" and self.emb_dim % 2:
      raise _invalid("emb_dim", self.emb_dim, "even for sinusoidal absolute encodings")
    if self.position == "relative" and not (self.relative_key or self.relative_value):
      raise _invalid("relative_key", self.relative_key,
                     "True when model.relative_value=False under model.position='relative' "
                     "(a^K and a^V cannot both be off; use position='none' for neither)")
    if self.position == "rope" and self.head_dim % 2:
      raise _invalid("qkv_dim", self.qkv_dim,
                     f"a multiple of 2 * model.num_heads={2 * self.num_heads} under "
                     f"model.position='rope' (even head dim)")
    if self.position == "t5":
      # The causal (decoder) buckets are the stricter case: num_buckets // 2 exact distances.
      if self.t5_num_buckets < 4:
        raise _invalid("t5_num_buckets", self.t5_num_buckets, "an integer >= 4")
      if self.t5_max_distance <= self.t5_num_buckets // 2:
        raise _invalid("t5_max_distance", self.t5_max_distance,
                       f"an integer > model.t5_num_buckets // 2 = {self.t5_num_buckets // 2}")
    if self.attention_implementation == "cudnn":
      self._check_cudnn()

  def _check_cudnn(self) -> None:
    """What cuDNN's fused attention needs of the whole model (shapes are checked per call)."""
    def invalid(name: str, value: Any, allowed: str) -> ValueError:
      return _invalid(name, value, f"{allowed} under model.attention_implementation='cudnn' "
                                   f"(or use 'auto', which falls back to XLA)")
    if jax.default_backend() != "gpu":
      raise invalid("attention_implementation", "cudnn",
                    f"a GPU backend, not {jax.default_backend()!r},")
    if self.dtype == "float32":
      raise invalid("dtype", self.dtype, "'bfloat16' or 'float16'")
    if self.position == "relative" and self.relative_value:
      raise invalid("relative_value", self.relative_value, "False (cuDNN cannot add a^V)")
    if self.attention_dropout_rate > 0:
      raise invalid("attention_dropout_rate", self.attention_dropout_rate, "0")
    if self.head_dim % 8 or self.head_dim > 128:
      raise invalid("qkv_dim", self.qkv_dim,
                    "a value giving a head depth (qkv_dim / num_heads) that is a multiple of 8 "
                    "and at most 128")

  @property
  def head_dim(self) -> int:
    """Per-head depth qkv_dim // num_heads."""
    return self.qkv_dim // self.num_heads

  @property
  def compute_dtype(self) -> Any:
    """The jnp dtype of `dtype`."""
    return DTYPES[self.dtype]

  @property
  def uses_absolute(self) -> bool:
    """Whether absolute encodings are added to the embeddings."""
    return self.position == "absolute" or self.add_absolute

  @classmethod
  def from_config(cls, model_cfg: ml_collections.ConfigDict,
                  vocab_size: int) -> "TransformerConfig":
    """Builds the config from `config.model` and the vocabulary size.

    A field with a default (one added after runs were saved) may be missing: it takes its
    default, with a warning.

    Raises:
      ValueError: on missing or unknown fields in model_cfg, or any invalid value.
    """
    fields = [field for field in dataclasses.fields(cls) if field.name != "vocab_size"]
    names = [field.name for field in fields]
    defaults = {field.name: field.default for field in fields
                if field.default is not dataclasses.MISSING and field.name not in model_cfg}
    missing = [name for name in names if name not in model_cfg and name not in defaults]
    unknown = sorted(set(model_cfg.keys()) - set(names))
    if missing or unknown:
      raise ValueError(f"config.model has missing fields {missing} and unknown fields {unknown}; "
                       f"its fields are: {', '.join(names)}.")
    for name, value in defaults.items():
      logging.warning("config.model.%s is missing (a config written before it existed): using "
                      "the default %r.", name, value)
    values = {name: model_cfg[name] for name in names if name in model_cfg}
    return cls(vocab_size=vocab_size, **values, **defaults)


class AbsolutePositionEncoding(nnx.Module):
  """Absolute encodings of token positions, sinusoidal or learned ([max_len, dim] table)."""

  def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
    self.dim = config.emb_dim
    self.max_len = config.max_len
    self.table = (nnx.Param(nnx.initializers.normal(stddev=0.02)(
        rngs.params(), (config.max_len, config.emb_dim)))
                  if config.absolute_type == "learned" else None)

  def __call__(self, positions: jax.Array) -> jax.Array:
    """Encodings [batch or 1, n, dim] of integer positions [batch or 1, n]."""
    if self.table is None:
      return positions_lib.sinusoidal_position_encoding(positions, self.dim)
    if positions.shape[-1] > self.max_len:
      raise ValueError(f"sequence length {positions.shape[-1]} exceeds model.max_len="
                       f"{self.max_len} (the learned absolute table).")
    return jnp.take(self.table[...], positions, axis=0)


class MlpBlock(nnx.Module):
  """Position-wise feed-forward block: Linear, ReLU, dropout, Linear."""

  def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
    init = nnx.initializers.xavier_uniform()
    self.wi = nnx.Linear(config.emb_dim, config.mlp_dim, kernel_init=init,
                         dtype=config.compute_dtype, param_dtype=jnp.float32, rngs=rngs)
    self.wo = nnx.Linear(config.mlp_dim, config.emb_dim, kernel_init=init,
                         dtype=config.compute_dtype, param_dtype=jnp.float32, rngs=rngs)
    self.dropout = nnx.Dropout(config.dropout_rate, rngs=rngs)

  def __call__(self, x: jax.Array, *, deterministic: bool) -> jax.Array:
    """[batch, n, emb_dim] -> [batch, n, emb_dim]."""
    return self.wo(self.dropout(nnx.relu(self.wi(x)), deterministic=deterministic))


def _layer_norm(config: TransformerConfig, rngs: nnx.Rngs) -> nnx.LayerNorm:
  """LayerNorm whose statistics are float32 and whose output is in the compute dtype."""
  return nnx.LayerNorm(config.emb_dim, dtype=config.compute_dtype, param_dtype=jnp.float32,
                       rngs=rngs)


class Residual(nnx.Module):
  """LayerNorm, dropout and skip connection around one sublayer, pre- or post-LN.

  Pre-LN: x + dropout(f(norm(x))). Post-LN: norm(x + dropout(f(x))). A sublayer f is applied
  as `residual(x, f(residual.sublayer_input(x)))`.
  """

  def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
    self.pre_layer_norm = config.pre_layer_norm
    self.norm = _layer_norm(config, rngs)
    self.dropout = nnx.Dropout(config.dropout_rate, rngs=rngs)

  def sublayer_input(self, x: jax.Array) -> jax.Array:
    """What the sublayer sees: norm(x) under pre-LN, else x. [batch, n, emb_dim]."""
    return self.norm(x) if self.pre_layer_norm else x

  def __call__(self, x: jax.Array, sublayer_output: jax.Array, *,
               deterministic: bool) -> jax.Array:
    """Adds the sublayer output [batch, n, emb_dim] to x [batch, n, emb_dim]."""
    out = x + self.dropout(sublayer_output, deterministic=deterministic)
    return out if self.pre_layer_norm else self.norm(out)


def _attention(config: TransformerConfig, position: str, *, rngs: nnx.Rngs,
               **position_modules: Any) -> attention.MultiHeadAttention:
  """A MultiHeadAttention layer; position_modules: relative_tables= or t5_bias= instances."""
  return attention.MultiHeadAttention(
      config.num_heads, config.emb_dim, qkv_dim=config.qkv_dim, position=position,
      rope_base=config.rope_base, dropout_rate=config.attention_dropout_rate,
      dtype=config.compute_dtype, implementation=config.attention_implementation, rngs=rngs,
      **position_modules)


def _relative_tables(config: TransformerConfig,
                     rngs: nnx.Rngs) -> attention.RelativePositionTables:
  return attention.RelativePositionTables(
      config.max_relative_position, config.head_dim,
      num_heads=config.num_heads if config.relative_per_head else None,
      use_key=config.relative_key, use_value=config.relative_value, rngs=rngs)


def _t5_bias(config: TransformerConfig, *, bidirectional: bool,
             rngs: nnx.Rngs) -> attention.T5RelativeBias:
  return attention.T5RelativeBias(config.num_heads, num_buckets=config.t5_num_buckets,
                                  max_distance=config.t5_max_distance,
                                  bidirectional=bidirectional, rngs=rngs)


def _self_attention_positions(config: TransformerConfig, num_layers: int, *, bidirectional: bool,
                              shared_tables: attention.RelativePositionTables | None,
                              rngs: nnx.Rngs) -> list[dict[str, Any]]:
  """Per layer of one stack: the position modules of its self-attention (keyword arguments).

  Relative tables: `shared_tables` in every layer when given, else one instance per layer.
  T5 bias: one instance for the whole stack when t5_shared_across_layers, else one per layer.
  """
  if config.position == "relative":
    return [{"relative_tables": shared_tables if shared_tables is not None
             else _relative_tables(config, rngs)} for _ in range(num_layers)]
  if config.position == "t5":
    if config.t5_shared_across_layers:
      return [{"t5_bias": _t5_bias(config, bidirectional=bidirectional, rngs=rngs)}] * num_layers
    return [{"t5_bias": _t5_bias(config, bidirectional=bidirectional, rngs=rngs)}
            for _ in range(num_layers)]
  return [{} for _ in range(num_layers)]


class EncoderLayer(nnx.Module):
  """Self-attention (with the configured position variant) and MLP, each in a Residual."""

  def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs, **position_modules: Any):
    self.self_attention = _attention(config, config.position, rngs=rngs, **position_modules)
    self.attention_residual = Residual(config, rngs=rngs)
    self.mlp = MlpBlock(config, rngs=rngs)
    self.mlp_residual = Residual(config, rngs=rngs)

  def __call__(self, x: jax.Array, *, mask: jax.Array, positions: jax.Array,
               deterministic: bool) -> jax.Array:
    """x [batch, s, emb_dim], mask bool [batch, 1, s, s], positions [batch or 1, s] -> x."""
    y = self.self_attention(self.attention_residual.sublayer_input(x), mask=mask,
                            query_positions=positions, deterministic=deterministic)
    x = self.attention_residual(x, y, deterministic=deterministic)
    y = self.mlp(self.mlp_residual.sublayer_input(x), deterministic=deterministic)
    return self.mlp_residual(x, y, deterministic=deterministic)


class DecoderLayer(nnx.Module):
  """Causal self-attention (position variant), cross-attention (no positions) and MLP."""

  def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs, **position_modules: Any):
    self.self_attention = _attention(config, config.position, rngs=rngs, **position_modules)
    self.self_attention_residual = Residual(config, rngs=rngs)
    self.cross_attention = _attention(config, "none", rngs=rngs)
    self.cross_attention_residual = Residual(config, rngs=rngs)
    self.mlp = MlpBlock(config, rngs=rngs)
    self.mlp_residual = Residual(config, rngs=rngs)

  def __call__(self, x: jax.Array, encoded: jax.Array, *, self_mask: jax.Array | None,
               cross_mask: jax.Array, positions: jax.Array, deterministic: bool,
               cache: attention.Cache | None = None,
               cache_index: jax.Array | None = None
               ) -> tuple[jax.Array, attention.Cache | None]:
    """One decoder layer, over a whole sequence or (with a cache) one step.

    Args:
      x: [batch, t, emb_dim] (t = 1 with a cache).
      encoded: [batch, s, emb_dim] encoder output.
      self_mask: bool [batch, 1, t, t]; None with a cache (the cache masks later slots).
      cross_mask: bool [batch, 1, t, s].
      positions: [batch or 1, t] target positions (unused with a cache: the query position is
        cache_index).
      deterministic: disables dropout.
      cache: None, or this layer's self-attention cache.
      cache_index: int32 scalar decode step (with a cache).

    Returns:
      (x [batch, t, emb_dim], the updated cache or None).
    """
    h = self.self_attention_residual.sublayer_input(x)
    if cache is None:
      y = self.self_attention(h, mask=self_mask, query_positions=positions,
                              deterministic=deterministic)
    else:
      y, cache = self.self_attention(h, deterministic=deterministic, cache=cache,
                                     cache_index=cache_index)
    x = self.self_attention_residual(x, y, deterministic=deterministic)
    y = self.cross_attention(self.cross_attention_residual.sublayer_input(x), encoded,
                             mask=cross_mask, deterministic=deterministic)
    x = self.cross_attention_residual(x, y, deterministic=deterministic)
    y = self.mlp(self.mlp_residual.sublayer_input(x), deterministic=deterministic)
    return self.mlp_residual(x, y, deterministic=deterministic), cache


class _Stack(nnx.Module):
  """What encoder and decoder share: embedding (+ absolute encodings), dropout, final norm."""

  def __init__(self, config: TransformerConfig, embed: nnx.Embed, *, rngs: nnx.Rngs):
    self.embed = embed
    self.absolute = AbsolutePositionEncoding(config, rngs=rngs) if config.uses_absolute else None
    self.embed_dropout = nnx.Dropout(config.dropout_rate, rngs=rngs)
    self.final_norm = _layer_norm(config, rngs) if config.pre_layer_norm else None

  def embed_tokens(self, tokens: jax.Array, positions: jax.Array, deterministic: bool) -> jax.Array:
    """Token embeddings [batch, n, emb_dim] (+ absolute encodings of positions [b or 1, n])."""
    x = self.embed(tokens)
    if self.absolute is not None:
      x = x + self.absolute(positions).astype(x.dtype)
    return self.embed_dropout(x, deterministic=deterministic)

  def _final(self, x: jax.Array) -> jax.Array:
    return x if self.final_norm is None else self.final_norm(x)


class Encoder(_Stack):
  """Embedding and a stack of EncoderLayers."""

  def __init__(self, config: TransformerConfig, embed: nnx.Embed, *,
               shared_tables: attention.RelativePositionTables | None, rngs: nnx.Rngs):
    super().__init__(config, embed, rngs=rngs)
    self.layers = nnx.List([
        EncoderLayer(config, rngs=rngs, **modules) for modules in _self_attention_positions(
            config, config.num_encoder_layers, bidirectional=True, shared_tables=shared_tables,
            rngs=rngs)])

  def __call__(self, tokens: jax.Array, *, positions: jax.Array, mask: jax.Array,
               deterministic: bool) -> jax.Array:
    """tokens [batch, s], positions [batch or 1, s], mask [batch, 1, s, s] -> [batch, s, d]."""
    x = self.embed_tokens(tokens, positions, deterministic)
    for layer in self.layers:
      x = layer(x, mask=mask, positions=positions, deterministic=deterministic)
    return self._final(x)


class Decoder(_Stack):
  """Embedding, a stack of DecoderLayers and the output logits."""

  def __init__(self, config: TransformerConfig, embed: nnx.Embed, *,
               shared_tables: attention.RelativePositionTables | None, rngs: nnx.Rngs):
    super().__init__(config, embed, rngs=rngs)
    self.layers = nnx.List([
        DecoderLayer(config, rngs=rngs, **modules) for modules in _self_attention_positions(
            config, config.num_decoder_layers, bidirectional=False, shared_tables=shared_tables,
            rngs=rngs)])
    self.logits = (None if config.logits_via_embedding else
                   nnx.Linear(config.emb_dim, config.vocab_size,
                              kernel_init=nnx.initializers.xavier_uniform(),
                              dtype=config.compute_dtype, param_dtype=jnp.float32, rngs=rngs))

  def __call__(self, encoded: jax.Array, tokens: jax.Array, *, positions: jax.Array,
               self_mask: jax.Array | None, cross_mask: jax.Array, deterministic: bool,
               cache: DecodeCache | None = None, cache_index: jax.Array | None = None
               ) -> tuple[jax.Array, DecodeCache | None]:
    """Decoder logits for input tokens [batch, t] (already shifted right).

    Args, as for DecoderLayer; positions also feed the absolute encodings; cache has one entry
    per layer.

    Returns:
      (logits [batch, t, vocab], the updated cache or None).
    """
    x = self.embed_tokens(tokens, positions, deterministic)
    caches = [None] * len(self.layers) if cache is None else cache
    new_cache = []
    for layer, layer_cache in zip(self.layers, caches):
      x, layer_cache = layer(x, encoded, self_mask=self_mask, cross_mask=cross_mask,
                             positions=positions, deterministic=deterministic,
                             cache=layer_cache, cache_index=cache_index)
      new_cache.append(layer_cache)
    return self._logits(self._final(x)), None if cache is None else new_cache

  def _logits(self, x: jax.Array) -> jax.Array:
    """float32 logits [batch, t, vocab] of x [batch, t, emb_dim] (products accumulated in
    float32 whatever the compute dtype)."""
    if self.logits is None:
      table = self.embed.embedding[...].astype(x.dtype)
      # [b, t, d] x [vocab, d] -> [b, t, vocab]
      logits = jnp.einsum("btd,vd->btv", x, table, preferred_element_type=jnp.float32)
      return logits / jnp.sqrt(jnp.float32(x.shape[-1]))
    kernel = self.logits.kernel[...].astype(x.dtype)
    # [b, t, d] x [d, vocab] -> [b, t, vocab]
    logits = jnp.einsum("btd,dv->btv", x, kernel, preferred_element_type=jnp.float32)
    return logits + self.logits.bias[...]


def _default_positions(tokens: jax.Array, positions: jax.Array | None) -> jax.Array:
  """Positions [batch, n] as given, else 0..n-1 as [1, n]."""
  if positions is None:
    return jnp.arange(tokens.shape[1], dtype=jnp.int32)[None]
  return jnp.asarray(positions, jnp.int32)


def _segmentation(tokens: jax.Array, segmentation: jax.Array | None) -> jax.Array:
  """Segment ids [batch, n] as given, else 1 on tokens and 0 on padding."""
  if segmentation is None:
    return (tokens != PAD_ID).astype(jnp.int32)
  return jnp.asarray(segmentation, jnp.int32)


def _segment_mask(query_segmentation: jax.Array, key_segmentation: jax.Array) -> jax.Array:
  """bool [batch, 1, q, k]: query and key lie in the same segment (padding = segment 0)."""
  return (query_segmentation[:, None, :, None] == key_segmentation[:, None, None, :])


def _shift_right(targets: jax.Array, segmentation: jax.Array) -> jax.Array:
  """Decoder inputs [batch, t]: targets shifted right by one with 0 at each segment start."""
  shifted = jnp.pad(targets, ((0, 0), (1, 0)))[:, :-1]
  previous_segment = jnp.pad(segmentation, ((0, 0), (1, 0)))[:, :-1]
  return jnp.where(segmentation == previous_segment, shifted, 0)


class Transformer(nnx.Module):
  """Encoder-decoder Transformer with the position variant of `config.position`.

  Attributes:
    config: the TransformerConfig.
    encoder, decoder: the two stacks; they share one embedding when config.share_embeddings
      and, under relative_shared_across_layers, one RelativePositionTables instance.
  """

  def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
    self.config = config

    def embedding() -> nnx.Embed:
      return nnx.Embed(config.vocab_size, config.emb_dim,
                       embedding_init=nnx.initializers.normal(stddev=1.0),
                       dtype=config.compute_dtype, param_dtype=jnp.float32, rngs=rngs)

    source_embed = embedding()
    target_embed = source_embed if config.share_embeddings else embedding()
    shared_tables = (_relative_tables(config, rngs)
                     if config.position == "relative" and config.relative_shared_across_layers
                     else None)
    self.encoder = Encoder(config, source_embed, shared_tables=shared_tables, rngs=rngs)
    self.decoder = Decoder(config, target_embed, shared_tables=shared_tables, rngs=rngs)

  def encode(self, inputs: jax.Array, *, inputs_positions: jax.Array | None = None,
             inputs_segmentation: jax.Array | None = None,
             deterministic: bool = True) -> jax.Array:
    """Encodes source tokens.

    Args:
      inputs: int32 [batch, s], 0 = padding.
      inputs_positions: int32 [batch, s] (restarting per packed segment), default 0..s-1.
      inputs_segmentation: int32 [batch, s] segment ids (0 = padding), default inputs != 0.
      deterministic: disables dropout.

    Returns:
      [batch, s, emb_dim] in the compute dtype.
    """
    segmentation = _segmentation(inputs, inputs_segmentation)
    return self.encoder(inputs, positions=_default_positions(inputs, inputs_positions),
                        mask=_segment_mask(segmentation, segmentation),
                        deterministic=deterministic)

  def decode(self, encoded: jax.Array, inputs: jax.Array, targets: jax.Array, *,
             targets_positions: jax.Array | None = None,
             inputs_segmentation: jax.Array | None = None,
             targets_segmentation: jax.Array | None = None,
             deterministic: bool = True) -> jax.Array:
    """Teacher-forced decoder: the logits of every target token given the ones before it.

    Args:
      encoded: [batch, s, emb_dim] from `encode`.
      inputs: int32 [batch, s] source tokens (for the cross-attention padding mask).
      targets: int32 [batch, t]; shifted right within each segment internally.
      targets_positions: int32 [batch, t], default 0..t-1.
      inputs_segmentation: int32 [batch, s], default inputs != 0.
      targets_segmentation: int32 [batch, t], default targets != 0.
      deterministic: disables dropout.

    Returns:
      float32 logits [batch, t, vocab_size].
    """
    source_segmentation = _segmentation(inputs, inputs_segmentation)
    segmentation = _segmentation(targets, targets_segmentation)
    length = targets.shape[1]
    causal = jnp.tril(jnp.ones((length, length), bool))[None, None]
    logits, _ = self.decoder(
        encoded, _shift_right(targets, segmentation),
        positions=_default_positions(targets, targets_positions),
        self_mask=_segment_mask(segmentation, segmentation) & causal,
        cross_mask=_segment_mask(segmentation, source_segmentation), deterministic=deterministic)
    return logits

  def __call__(self, inputs: jax.Array, targets: jax.Array, *,
               inputs_positions: jax.Array | None = None,
               targets_positions: jax.Array | None = None,
               inputs_segmentation: jax.Array | None = None,
               targets_segmentation: jax.Array | None = None,
               deterministic: bool = True) -> jax.Array:
    """Logits [batch, t, vocab_size] of targets [batch, t] given inputs [batch, s] (see
    `encode` and `decode` for the optional arrays)."""
    encoded = self.encode(inputs, inputs_positions=inputs_positions,
                          inputs_segmentation=inputs_segmentation, deterministic=deterministic)
    return self.decode(encoded, inputs, targets, targets_positions=targets_positions,
                       inputs_segmentation=inputs_segmentation,
                       targets_segmentation=targets_segmentation, deterministic=deterministic)

  def init_cache(self, batch_size: int, max_decode_len: int) -> DecodeCache:
    """Zero decode cache: per decoder layer {'key', 'value'}: [batch, max_decode_len, heads,
    head_dim].

    Raises:
      ValueError: if max_decode_len exceeds max_len under learned absolute encodings.
    """
    if self.decoder.absolute is not None and self.decoder.absolute.table is not None and (
        max_decode_len > self.config.max_len):
      raise ValueError(f"max_decode_len={max_decode_len} exceeds model.max_len="
                       f"{self.config.max_len} (the learned absolute table).")
    return [layer.self_attention.init_cache(batch_size, max_decode_len)
            for layer in self.decoder.layers]

  def decode_step(self, encoded: jax.Array, inputs: jax.Array, tokens: jax.Array,
                  step: jax.Array | int, cache: DecodeCache) -> tuple[jax.Array, DecodeCache]:
    """One cached decoder step: the logits of the token at position `step`.

    Equals `decode(...)[:, step]` when tokens are the targets before `step` fed one by one.

    Args:
      encoded: [n, s, emb_dim].
      inputs: int32 [n, s] source tokens (padding mask).
      tokens: int32 [n], the token at position step - 1 (0 at step 0).
      step: int32 scalar, the position being predicted (the query's position).
      cache: from `init_cache(n, max_decode_len)` or the previous step.

    Returns:
      (float32 logits [n, vocab_size], the updated cache).
    """
    step = jnp.asarray(step, jnp.int32)
    logits, cache = self.decoder(
        encoded, jnp.asarray(tokens, jnp.int32)[:, None], positions=jnp.full((1, 1), step),
        self_mask=None, cross_mask=(inputs != PAD_ID)[:, None, None, :], deterministic=True,
        cache=cache, cache_index=step)
    return logits[:, 0], cache
