"""Encoder-decoder Transformer (Flax NNX) whose position information is a plug-in variant.

`TransformerConfig.position` names a registered variant of `relpos.variants` (absolute,
relative, t5, rope, alibi, fire, shape, randomized, none, or one of the user's own); the model
asks it for a module added to each stack's embeddings and for one position module per
self-attention layer, and never compares a variant's name.

Parameters are float32; `dtype` ('float32', 'bfloat16', 'float16') is the compute dtype of
activations, matmuls and the decode cache, while layer-norm statistics, attention logits and
softmax, the output logits and the loss stay float32 (mixed precision as in t5x and flax's wmt
example). `attention_implementation` chooses the attention kernel ('auto', 'xla', 'cudnn').

Cross-attention never sees positions. Positions come from per-token position arrays (default
0..n-1), and attention masks from segment ids, so a packed batch gives the same outputs as its
sentences one by one. Token 0 is padding (`PAD_ID`).
"""
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from relpos import attention
from relpos import positions as positions_lib
from relpos import variants
from relpos.model_config import TransformerConfig
from relpos.data.tokenizer import PAD_ID

DecodeCache = list[attention.Cache]


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

  def __call__(self, x: jax.Array, sublayer_output: jax.Array, *, deterministic: bool) -> jax.Array:
    """Adds the sublayer output [batch, n, emb_dim] to x [batch, n, emb_dim]."""
    out = x + self.dropout(sublayer_output, deterministic=deterministic)
    return out if self.pre_layer_norm else self.norm(out)


def _attention(config: TransformerConfig, position: variants.AttentionPosition | None, *,
               rngs: nnx.Rngs) -> attention.MultiHeadAttention:
  """A MultiHeadAttention layer with the position module `position` (None: cross-attention)."""
  return attention.MultiHeadAttention(config.num_heads, config.emb_dim, qkv_dim=config.qkv_dim,
                                      position=position, dropout_rate=config.attention_dropout_rate,
                                      dtype=config.compute_dtype,
                                      implementation=config.attention_implementation, rngs=rngs)


class EncoderLayer(nnx.Module):
  """Self-attention (with the variant's position module) and MLP, each in a Residual."""
  def __init__(self, config: TransformerConfig, position: variants.AttentionPosition | None, *,
               rngs: nnx.Rngs):
    self.self_attention = _attention(config, position, rngs=rngs)
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
  def __init__(self, config: TransformerConfig, position: variants.AttentionPosition | None, *,
               rngs: nnx.Rngs):
    self.self_attention = _attention(config, position, rngs=rngs)
    self.self_attention_residual = Residual(config, rngs=rngs)
    self.cross_attention = _attention(config, None, rngs=rngs)
    self.cross_attention_residual = Residual(config, rngs=rngs)
    self.mlp = MlpBlock(config, rngs=rngs)
    self.mlp_residual = Residual(config, rngs=rngs)

  def __call__(self, x: jax.Array, encoded: jax.Array, *, self_mask: jax.Array | None,
               cross_mask: jax.Array, positions: jax.Array, deterministic: bool,
               cache: attention.Cache | None = None,
               cache_index: jax.Array | None = None) -> tuple[jax.Array, attention.Cache | None]:
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
  """What encoder and decoder share: embedding (+ the variant's position embedding), dropout,
  final norm."""
  def __init__(self, config: TransformerConfig, embed: nnx.Embed, variant: variants.Variant, *,
               rngs: nnx.Rngs):
    self.embed = embed
    self.position_embedding = variant.embedding(rngs=rngs)
    self.embed_dropout = nnx.Dropout(config.dropout_rate, rngs=rngs)
    self.final_norm = _layer_norm(config, rngs) if config.pre_layer_norm else None

  def embed_tokens(self, tokens: jax.Array, positions: jax.Array, deterministic: bool) -> jax.Array:
    """Token embeddings [batch, n, emb_dim] (+ the position embedding of positions [b or 1, n])."""
    x = self.embed(tokens)
    if isinstance(self.position_embedding, variants.StochasticEmbedding):
      positions = jnp.broadcast_to(positions, tokens.shape)
      encoding = self.position_embedding(positions, deterministic=deterministic)
      x = x + encoding.astype(x.dtype)
    elif self.position_embedding is not None:
      x = x + self.position_embedding(positions).astype(x.dtype)
    return self.embed_dropout(x, deterministic=deterministic)

  def _final(self, x: jax.Array) -> jax.Array:
    return x if self.final_norm is None else self.final_norm(x)

  @staticmethod
  def _layer_positions(variant: variants.Variant, num_layers: int, *, causal: bool,
                       rngs: nnx.Rngs) -> list[variants.AttentionPosition | None]:
    """`variant.self_attention(...)`: one entry per layer, else a ValueError naming it."""
    positions = list(variant.self_attention(num_layers, causal=causal, rngs=rngs))
    if len(positions) != num_layers:
      raise ValueError(f"self_attention({num_layers}, causal={causal}) of variant "
                       f"{variant.name!r} returned {len(positions)} entries; the stack has "
                       f"{num_layers} layers, one entry (or None) each.")
    return positions


class Encoder(_Stack):
  """Embedding and a stack of EncoderLayers."""
  def __init__(self, config: TransformerConfig, embed: nnx.Embed, variant: variants.Variant, *,
               rngs: nnx.Rngs):
    super().__init__(config, embed, variant, rngs=rngs)
    attention_positions = self._layer_positions(variant, config.num_encoder_layers, causal=False,
                                                rngs=rngs)
    self.layers = nnx.List(
        [EncoderLayer(config, position, rngs=rngs) for position in attention_positions])

  def __call__(self, tokens: jax.Array, *, positions: jax.Array, mask: jax.Array,
               deterministic: bool) -> jax.Array:
    """tokens [batch, s], positions [batch or 1, s], mask [batch, 1, s, s] -> [batch, s, d]."""
    x = self.embed_tokens(tokens, positions, deterministic)
    for layer in self.layers:
      x = layer(x, mask=mask, positions=positions, deterministic=deterministic)
    return self._final(x)


class Decoder(_Stack):
  """Embedding, a stack of DecoderLayers and the output logits."""
  def __init__(self, config: TransformerConfig, embed: nnx.Embed, variant: variants.Variant, *,
               rngs: nnx.Rngs):
    super().__init__(config, embed, variant, rngs=rngs)
    attention_positions = self._layer_positions(variant, config.num_decoder_layers, causal=True,
                                                rngs=rngs)
    self.layers = nnx.List(
        [DecoderLayer(config, position, rngs=rngs) for position in attention_positions])
    self.logits = (None if config.logits_via_embedding else nnx.Linear(
        config.emb_dim, config.vocab_size, kernel_init=nnx.initializers.xavier_uniform(),
        dtype=config.compute_dtype, param_dtype=jnp.float32, rngs=rngs))

  def __call__(self, encoded: jax.Array, tokens: jax.Array, *, positions: jax.Array,
               self_mask: jax.Array | None, cross_mask: jax.Array, deterministic: bool,
               cache: DecodeCache | None = None,
               cache_index: jax.Array | None = None) -> tuple[jax.Array, DecodeCache | None]:
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
                             positions=positions, deterministic=deterministic, cache=layer_cache,
                             cache_index=cache_index)
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
    encoder, decoder: the two stacks; they share one embedding when config.share_embeddings,
      and the position modules the variant hands to both.
  """
  def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
    self.config = config

    def embedding() -> nnx.Embed:
      return nnx.Embed(config.vocab_size, config.emb_dim,
                       embedding_init=nnx.initializers.normal(stddev=1.0),
                       dtype=config.compute_dtype, param_dtype=jnp.float32, rngs=rngs)

    source_embed = embedding()
    target_embed = source_embed if config.share_embeddings else embedding()
    variant = variants.get(config.position)(config)
    self.encoder = Encoder(config, source_embed, variant, rngs=rngs)
    self.decoder = Decoder(config, target_embed, variant, rngs=rngs)

  def encode(self, inputs: jax.Array, *, inputs_positions: jax.Array | None = None,
             inputs_segmentation: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
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
    return self.encoder(
        inputs, positions=positions_lib.as_positions(inputs_positions, inputs.shape[1],
                                                     "inputs_positions"),
        mask=_segment_mask(segmentation, segmentation), deterministic=deterministic)

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
        positions=positions_lib.as_positions(targets_positions, targets.shape[1],
                                             "targets_positions"),
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
      ValueError: if max_decode_len exceeds model.max_len (the longest sequence the model is
        built for, e.g. its learned absolute table).
    """
    self.check_decode_len(max_decode_len)
    return [
        layer.self_attention.init_cache(batch_size, max_decode_len) for layer in self.decoder.layers
    ]

  def check_decode_len(self, max_decode_len: int) -> None:
    """Raises ValueError if max_decode_len exceeds model.max_len (the longest sequence the
    model is built for, e.g. its learned absolute table); the one home of this check, for the
    cache and for decoding without it."""
    if max_decode_len > self.config.max_len:
      raise ValueError(f"max_decode_len={max_decode_len} exceeds model.max_len="
                       f"{self.config.max_len}.")

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
    logits, cache = self.decoder(encoded,
                                 jnp.asarray(tokens, jnp.int32)[:, None], positions=jnp.full(
                                     (1, 1), step), self_mask=None,
                                 cross_mask=(inputs != PAD_ID)[:, None, None, :],
                                 deterministic=True, cache=cache, cache_index=step)
    return logits[:, 0], cache


def build_model(model_config: TransformerConfig, seed: int) -> Transformer:
  """A freshly initialized Transformer: parameters and dropout stream from `seed`."""
  params_key, dropout_key = jax.random.split(jax.random.key(seed))
  return Transformer(model_config, rngs=nnx.Rngs(params=params_key, dropout=dropout_key))


def split_model(model: Transformer) -> tuple[nnx.GraphDef, Any, Any]:
  """(graphdef, params, rng) of a model; params and rng as pure nested dicts."""
  graphdef, params, rng = nnx.split(model, nnx.Param, nnx.RngState)
  return graphdef, nnx.to_pure_dict(params), nnx.to_pure_dict(rng)


def abstract_model(model_config: TransformerConfig) -> tuple[nnx.GraphDef, Any, Any]:
  """`split_model` of the model `model_config` builds, with jax.ShapeDtypeStruct leaves."""
  return split_model(nnx.eval_shape(lambda: build_model(model_config, 0)))
