"""What a model's encoder self-attention does with positions, measured on a batch of sources.

`position_statistics` runs a model's encoder on source sentences and measures, per encoder layer
(self-attention, averaged over heads, sentences and query tokens):

- "attention_by_offset": mean attention weight a query puts on the key at offset j - i,
  for offsets -MAX_OFFSET..MAX_OFFSET (only pairs inside the sentence count);
- "longest_distance": the largest |j - i| within one of the sentences (their longest length
  minus 1), the distances the plots show;
- what each layer's position module adds (`relpos.variants.AttentionPosition.add_statistics`):
  "qak_by_offset" [layer][2k+1] and "max_distance" k (relative, with a^K: the mean logit
  q_i · a^K[d] / sqrt(depth) a^K adds at each clipped offset d = -k..k), "t5_bias"
  [buckets][heads] (t5: the encoder's learned bias).

`attention_profile` measures, per encoder layer, how spread out each query's attention is
("entropy_by_query", in nats, by query position) and the offset profile above; a table's run
computes it on short (test) and long (test_long) sources beside each other (docs/length.md).

A table stores both in each run's result.json (`relpos.experiments.single_run`), and
`relpos.experiments.plots_learned` draws them from results.json alone; `relpos.variant_trial`
runs `position_statistics` on a small model of a variant of one's own before any work.
"""

from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from relpos import model as model_lib
from relpos.data import tokenizer as tokenizer_lib

MAX_OFFSET = 10


def _mean_by_offset(weights: np.ndarray, valid: np.ndarray) -> list[float | None]:
  """Mean of weights[b, h, i, i + d] over valid (i, i + d) pairs, for d in ±MAX_OFFSET.

  Args:
    weights: [batch, heads, n, n].
    valid: bool [batch, n], True on tokens.
  """
  n = weights.shape[-1]
  means = []
  for offset in range(-MAX_OFFSET, MAX_OFFSET + 1):
    rows = np.arange(max(0, -offset), min(n, n - offset))
    if rows.size == 0:
      means.append(None)
      continue
    diagonal = weights[:, :, rows, rows + offset]  # [batch, heads, len(rows)]
    pair_valid = valid[:, rows] & valid[:, rows + offset]  # [batch, len(rows)]
    count = pair_valid.sum() * weights.shape[1]
    means.append(float((diagonal * pair_valid[:, None]).sum() / count) if count else None)
  return means


def _encoder_attention(model: model_lib.Transformer,
                       inputs: np.ndarray) -> Iterator[tuple[Any, jnp.ndarray, np.ndarray]]:
  """Runs the encoder on `inputs` [batch, n] (PAD_ID padded) one layer at a time.

  Yields:
    Per layer: (its self-attention module, the sublayer input [batch, n, emb_dim], the
    attention weights [batch, heads, n, n] as numpy float32).
  """
  encoder = model.encoder
  valid = inputs != tokenizer_lib.PAD_ID
  positions = jnp.arange(inputs.shape[1], dtype=jnp.int32)[None]
  mask = jnp.asarray(valid[:, None, :, None] & valid[:, None, None, :])
  x = _embed(encoder, jnp.asarray(inputs), positions)
  for layer in encoder.layers:
    sublayer_input, weights = _sublayer_input_and_weights(layer, x, mask, positions)
    yield layer.self_attention, sublayer_input, np.asarray(weights)
    x = _layer(layer, x, mask, positions)


# The encoder's pieces, each compiled once (not run op by op: 3.2 s -> 1.6 s for the trial
# model of a variant on 2 cores), deterministic.
@nnx.jit
def _embed(encoder: nnx.Module, inputs: jax.Array, positions: jax.Array) -> jax.Array:
  return encoder.embed_tokens(inputs, positions, True)


@nnx.jit
def _sublayer_input_and_weights(layer: nnx.Module, x: jax.Array, mask: jax.Array,
                                positions: jax.Array) -> tuple[jax.Array, jax.Array]:
  sublayer_input = layer.attention_residual.sublayer_input(x)
  return sublayer_input, layer.self_attention.attention_weights(sublayer_input, mask=mask,
                                                                query_positions=positions)


@nnx.jit
def _layer(layer: nnx.Module, x: jax.Array, mask: jax.Array, positions: jax.Array) -> jax.Array:
  return layer(x, mask=mask, positions=positions, deterministic=True)


def position_statistics(model: model_lib.Transformer, inputs: np.ndarray) -> dict[str, Any]:
  """Encoder position statistics (see the module docstring) on a batch of sources.

  Args:
    model: a restored Transformer.
    inputs: int32 [batch, n] source tokens, PAD_ID padded, one sentence a row.

  Returns:
    {"attention_by_offset": [layer][2*MAX_OFFSET+1] (None where no pair exists),
     "offsets": list of offsets, "longest_distance": int, plus what the position modules add
     (the module docstring)}.
  """
  valid = inputs != tokenizer_lib.PAD_ID
  stats: dict[str, Any] = {
      "offsets": list(range(-MAX_OFFSET, MAX_OFFSET + 1)), "attention_by_offset": [],
      "longest_distance": int(valid.sum(axis=1).max()) - 1
  }
  for attention, sublayer_input, weights in _encoder_attention(model, inputs):
    stats["attention_by_offset"].append(_mean_by_offset(weights, valid))
    if attention.position is not None:
      attention.position.add_statistics(stats, attention.query(sublayer_input), valid)
  return stats


def _entropy(weights: np.ndarray) -> np.ndarray:
  """Entropy (nats) of each query's attention, averaged over heads: weights [batch, heads, n,
  n] -> [batch, n] (0 * log 0 counts 0)."""
  positive = weights > 0
  terms = np.where(positive, -weights * np.log(np.where(positive, weights, 1.0)), 0.0)
  return terms.sum(-1).mean(1)  # sum over keys, mean over heads


def attention_entropy(weights: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Entropy (nats) of each valid query's attention, averaged over heads and sentences.

  Args:
    weights: [batch, heads, n, n], rows summing to 1 over the valid keys.
    valid: bool [batch, n], True on tokens.

  Returns:
    (mean entropy by query position [n] (nan where no sentence has that position), the
     number of sentences with a token there [n]).
  """
  entropy = _entropy(weights)  # [batch, n]
  count = valid.sum(0)
  total = (entropy * valid).sum(0)
  return np.where(count > 0, total / np.maximum(count, 1), np.nan), count


def attention_profile(model: model_lib.Transformer, inputs: np.ndarray) -> dict[str, Any]:
  """How the encoder's self-attention spreads on a batch of sources, per layer.

  Args:
    model: a restored Transformer.
    inputs: int32 [batch, n] source tokens, PAD_ID padded, one sentence a row.

  Returns:
    {"entropy_by_query": [layer][n] mean entropy (nats) of query position i's attention
     (None where no sentence is that long), "count_by_query": [n] sentences per position,
     "normalized_entropy": [layer] mean over queries of entropy / log(sentence length)
     (1 = uniform over the sentence, 0 = one key), "attention_by_offset": [layer][offsets]
     as in `position_statistics`, "offsets", "mean_length": mean tokens per sentence}.
  """
  valid = inputs != tokenizer_lib.PAD_ID
  lengths = valid.sum(1)  # [batch]
  # log of each sentence's length, 1 for one-token sentences (their entropy is 0)
  log_length = np.log(np.maximum(lengths, 2))[:, None]  # [batch, 1]
  profile: dict[str, Any] = {
      "entropy_by_query": [], "normalized_entropy": [], "attention_by_offset": [],
      "offsets": list(range(-MAX_OFFSET, MAX_OFFSET + 1)), "mean_length": float(lengths.mean())
  }
  for _, _, weights in _encoder_attention(model, inputs):
    by_query, _ = attention_entropy(weights, valid)
    entropy = _entropy(weights)  # [batch, n]
    profile["entropy_by_query"].append([None if np.isnan(e) else float(e) for e in by_query])
    profile["normalized_entropy"].append(float((entropy / log_length * valid).sum() / valid.sum()))
    profile["attention_by_offset"].append(_mean_by_offset(weights, valid))
  profile["count_by_query"] = valid.sum(0).tolist()
  return profile
