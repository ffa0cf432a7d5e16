"""Beam search and greedy search over a cached decoder, and `translate` for a Transformer.

Both searches drive a `tokens_to_logits(tokens, step, cache) -> (logits, cache)` function:
`tokens` [n] holds the previous token of every hypothesis (0 at step 0), `step` is the int32
position of the token being predicted, and every leaf of `cache` has leading dimension n. The
output token of step t is written at position t, so a sequence holds its tokens, then eos, then
padding 0 (`PAD_ID`).

Beam search follows tensor2tensor / flax examples/wmt: it keeps the `beam_size` best live
hypotheses and the `beam_size` best finished ones, scores a finished hypothesis of L tokens
(eos included) by log_prob / ((5 + L) / 6) ** alpha (GNMT length penalty), and stops as soon as
no live hypothesis can beat the worst finished one. A hypothesis that reaches max_decode_len
without eos is cut there and ranks below every hypothesis that ended with eos, as in those
implementations: it never paid for its eos, so a repetition loop cut at the budget would
otherwise beat a complete translation (until 28 November 2026 it was scored as finished, with
L = max_decode_len). Cut hypotheses fill only the slots that finished ones leave.

Neither search emits id 0, the padding, which no training target holds and which a decoded
sentence would drop without trace; nor, given `output_vocab_size` (the tokenizer's size, which
can be smaller than the model's vocabulary: SentencePiece may find fewer pieces than asked for),
the ids the tokenizer cannot decode. Beam search sets their log-probabilities to -inf after the
softmax, so every other token keeps the log-probability the trained model gives it (the softmax
it was trained with); greedy search takes the argmax over the other ids.

Both searches take optional per-input length bounds `min_len` and `max_len` (int32 [batch],
in tokens, eos included): eos is forbidden while a hypothesis is shorter than `min_len` and is
the only token allowed when it reaches `max_len`. With min_len = max_len = the reference's
token length this is oracle-length decoding (Newman et al. 2020, "The EOS Decision and Length
Extrapolation"): the output has exactly the reference's length. Without bounds the searches are
unchanged (no mask is applied).
"""
import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from relpos.data.tokenizer import PAD_ID

TokensToLogits = Callable[[jax.Array, jax.Array, Any], tuple[jax.Array, Any]]


def length_penalty(length: jax.Array | int, alpha: float) -> jax.Array:
  """GNMT length penalty ((5 + length) / 6) ** alpha (Wu et al. 2016)."""
  return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0)**alpha


def _gather_beams(x: jax.Array, indices: jax.Array) -> jax.Array:
  """Picks beams: x [batch, beams, ...], indices [batch, new_beams] -> [batch, new_beams, ...]."""
  return jax.vmap(lambda beams, index: beams[index])(x, indices)


def _gather_cache(cache: Any, indices: jax.Array) -> Any:
  """Reorders cache leaves [batch * beams, ...] by indices [batch, new_beams]."""
  batch, new_beams = indices.shape

  def gather(leaf: jax.Array) -> jax.Array:
    beams = leaf.reshape(batch, -1, *leaf.shape[1:])
    return _gather_beams(beams, indices).reshape(batch * new_beams, *leaf.shape[1:])

  return jax.tree.map(gather, cache)


def _previous_tokens(sequences: jax.Array, step: jax.Array) -> jax.Array:
  """The token before `step` of sequences [..., length] (0 at step 0): [...]."""
  previous = jax.lax.dynamic_index_in_dim(sequences, jnp.maximum(step - 1, 0), axis=-1,
                                          keepdims=False)
  return jnp.where(step > 0, previous, 0)


class _BeamState(NamedTuple):
  """Loop state of `beam_search` (b = batch, k = beam_size, L = max_decode_len)."""
  step: jax.Array  # int32 scalar: the position decoded next.
  alive_sequences: jax.Array  # int32 [b, k, L], best first.
  alive_log_probs: jax.Array  # float32 [b, k]; -inf marks an empty slot.
  finished_sequences: jax.Array  # int32 [b, k, L], best first.
  finished_scores: jax.Array  # float32 [b, k]; -inf marks an empty slot.
  # The best hypotheses cut at L without eos (set at the last step), as finished ones.
  cut_sequences: jax.Array  # int32 [b, k, L], best first.
  cut_scores: jax.Array  # float32 [b, k]; -inf marks an empty slot.
  cache: Any  # leaves [b * k, ...], aligned with alive_sequences.


def _check_search_args(batch_size: int, max_decode_len: int, eos_id: int,
                       output_vocab_size: int | None) -> None:
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
  if max_decode_len < 1:
    raise ValueError(f"max_decode_len must be >= 1, got {max_decode_len}.")
  if eos_id == PAD_ID:
    raise ValueError(f"eos_id must not be the padding id {PAD_ID}.")
  if output_vocab_size is not None and output_vocab_size <= eos_id:
    raise ValueError(f"output_vocab_size must exceed eos_id={eos_id}, got {output_vocab_size}.")


def _forbid_unemittable(scores: jax.Array, output_vocab_size: int | None) -> jax.Array:
  """scores [..., vocab] with -inf at PAD_ID and at ids >= output_vocab_size (None: none)."""
  ids = jnp.arange(scores.shape[-1])  # [vocab]
  emittable = ids != PAD_ID
  if output_vocab_size is not None:
    emittable &= ids < output_vocab_size
  return jnp.where(emittable, scores, -jnp.inf)


def _bound_length(scores: jax.Array, step: jax.Array, eos_id: int, min_len: jax.Array | None,
                  max_len: jax.Array | None) -> jax.Array:
  """scores [n, vocab] of the token at position `step`, with eos set to -inf where the output
  would be shorter than min_len [n] and every other token set to -inf where it reaches
  max_len [n] (lengths in tokens, eos included); unchanged where a bound is None."""
  length = step + 1  # the output's length if it ends with the token chosen now
  is_eos = jnp.arange(scores.shape[-1]) == eos_id  # [vocab]
  if min_len is not None:
    scores = jnp.where(is_eos & (length < min_len)[:, None], -jnp.inf, scores)
  if max_len is not None:
    scores = jnp.where(~is_eos & (length >= max_len)[:, None], -jnp.inf, scores)
  return scores


def beam_search(tokens_to_logits: TokensToLogits, cache: Any, *, batch_size: int,
                beam_size: int = 4, alpha: float = 0.6, eos_id: int = 1, max_decode_len: int,
                output_vocab_size: int | None = None, min_len: jax.Array | None = None,
                max_len: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """Beam search with the GNMT length penalty and early stopping.

  Args:
    tokens_to_logits: (tokens [n] int32, step int32 scalar, cache) -> (logits [n, vocab], cache),
      with n = batch_size * beam_size (row r is batch r // beam_size).
    cache: initial decoder cache, leaves [n, ...].
    batch_size: number of inputs b.
    beam_size: hypotheses kept per input (>= 1).
    alpha: length penalty exponent (>= 0; 0 ranks by log-probability alone).
    eos_id: end-of-sequence token.
    max_decode_len: L, the most tokens per hypothesis (eos included).
    output_vocab_size: ids >= this are never emitted (None: every id of the logits).
    min_len: None, or int32 [batch]: no hypothesis of input b ends (eos included) before
      min_len[b] tokens.
    max_len: None, or int32 [batch] <= L: every hypothesis of input b ends with eos at
      max_len[b] tokens; min_len = max_len fixes the length (oracle-length decoding).

  Returns:
    sequences: int32 [batch, beam_size, L], padded with 0: those that ended with eos, best
      first, then where fewer than beam_size did, those cut at L without eos, best first.
    scores: float32 [batch, beam_size], log_prob / length_penalty, in that order; -inf (with
      an all-zero sequence) where fewer than beam_size hypotheses exist.

  Raises:
    ValueError: on beam_size, batch_size or max_decode_len < 1, alpha < 0, eos_id = PAD_ID
      or output_vocab_size <= eos_id.
  """
  _check_search_args(batch_size, max_decode_len, eos_id, output_vocab_size)
  if beam_size < 1:
    raise ValueError(f"beam_size must be >= 1, got {beam_size}.")
  if alpha < 0:
    raise ValueError(f"alpha must be >= 0 (early stopping needs a penalty that grows with "
                     f"length), got {alpha}.")
  shape = (batch_size, beam_size)
  sequences = jnp.zeros((*shape, max_decode_len), jnp.int32)
  no_scores = jnp.full(shape, -jnp.inf, jnp.float32)
  # Only beam 0 is live at the start, so the first step expands one hypothesis per input.
  state = _BeamState(step=jnp.array(0, jnp.int32), alive_sequences=sequences,
                     alive_log_probs=no_scores.at[:, 0].set(0.0), finished_sequences=sequences,
                     finished_scores=no_scores, cut_sequences=sequences, cut_scores=no_scores,
                     cache=cache)
  best_possible_penalty = length_penalty(max_decode_len, alpha)
  # Bounds per hypothesis row [batch * beam_size] (row r is input r // beam_size).
  tile = lambda bound: None if bound is None else jnp.repeat(jnp.asarray(bound, jnp.int32),
                                                             beam_size)
  row_min_len, row_max_len = tile(min_len), tile(max_len)

  def not_done(state: _BeamState) -> jax.Array:
    # Log-probabilities only fall and the penalty only grows, so a live hypothesis scores at
    # most its log-probability over the penalty of the longest length.
    best_live = state.alive_log_probs[:, 0] / best_possible_penalty
    can_improve = jnp.any(best_live > state.finished_scores[:, -1])
    return (state.step < max_decode_len) & can_improve

  def expand(state: _BeamState) -> _BeamState:
    step = state.step
    tokens = _previous_tokens(state.alive_sequences, step).reshape(-1)
    logits, cache = tokens_to_logits(tokens, step, state.cache)
    vocab_size = logits.shape[-1]
    log_probs = _forbid_unemittable(jax.nn.log_softmax(logits.astype(jnp.float32)),
                                    output_vocab_size)
    log_probs = _bound_length(log_probs, step, eos_id, row_min_len,
                              row_max_len).reshape(*shape, vocab_size)
    candidates = (state.alive_log_probs[..., None] + log_probs).reshape(batch_size, -1)
    # 2k candidates always hold k that do not end here (at most k of them end with eos).
    top_log_probs, top_index = jax.lax.top_k(candidates, 2 * beam_size)
    top_beam, top_token = top_index // vocab_size, top_index % vocab_size
    top_sequences = _gather_beams(state.alive_sequences, top_beam).at[:, :, step].set(top_token)
    ends_with_eos, last = top_token == eos_id, step == max_decode_len - 1
    scores = top_log_probs / length_penalty(step + 1, alpha)  # [b, 2k] if each ended here

    alive_log_probs, alive_pick = jax.lax.top_k(
        jnp.where(ends_with_eos | last, -jnp.inf, top_log_probs), beam_size)
    finished_scores, finished_pick = jax.lax.top_k(
        jnp.concatenate([state.finished_scores,
                         jnp.where(ends_with_eos, scores, -jnp.inf)], axis=1), beam_size)
    finished_sequences = _gather_beams(
        jnp.concatenate([state.finished_sequences, top_sequences], axis=1), finished_pick)
    # Cut at L: only the last step has any (no step follows it to replace them).
    cut_scores, cut_pick = jax.lax.top_k(jnp.where(last & ~ends_with_eos, scores, -jnp.inf),
                                         beam_size)
    return _BeamState(step=step + 1, alive_sequences=_gather_beams(top_sequences, alive_pick),
                      alive_log_probs=alive_log_probs, finished_sequences=finished_sequences,
                      finished_scores=finished_scores,
                      cut_sequences=_gather_beams(top_sequences, cut_pick), cut_scores=cut_scores,
                      cache=_gather_cache(cache, _gather_beams(top_beam, alive_pick)))

  state = jax.lax.while_loop(not_done, expand, state)
  # Slot j of input b: its j-th finished hypothesis, or past its n finished ones, cut one j - n.
  num_finished = jnp.sum(state.finished_scores > -jnp.inf, axis=1, keepdims=True)  # [b, 1]
  slot = jnp.arange(beam_size)[None, :]  # [1, k]
  from_cut = slot >= num_finished  # [b, k]
  cut_index = jnp.clip(slot - num_finished, 0, beam_size - 1)  # [b, k]
  sequences = jnp.where(from_cut[..., None], _gather_beams(state.cut_sequences, cut_index),
                        state.finished_sequences)  # [b, k, L]
  scores = jnp.where(from_cut, jnp.take_along_axis(state.cut_scores, cut_index, axis=1),
                     state.finished_scores)  # [b, k]
  return jnp.where((scores > -jnp.inf)[..., None], sequences, 0), scores


class _GreedyState(NamedTuple):
  """Loop state of `greedy_search`."""
  step: jax.Array  # int32 scalar.
  sequences: jax.Array  # int32 [batch, L].
  finished: jax.Array  # bool [batch]: eos emitted.
  cache: Any


def greedy_search(tokens_to_logits: TokensToLogits, cache: Any, *, batch_size: int, eos_id: int = 1,
                  max_decode_len: int, output_vocab_size: int | None = None,
                  min_len: jax.Array | None = None, max_len: jax.Array | None = None) -> jax.Array:
  """Greedy decoding: the argmax token at every step until eos (or max_decode_len).

  Args:
    tokens_to_logits: (tokens [batch] int32, step int32 scalar, cache) ->
      (logits [batch, vocab], cache).
    cache: initial decoder cache, leaves [batch, ...].
    batch_size: number of inputs.
    eos_id: end-of-sequence token.
    max_decode_len: L, the most tokens per sequence (eos included).
    output_vocab_size: ids >= this are never emitted (None: every id of the logits).
    min_len, max_len: None, or int32 [batch] length bounds (eos included), as in `beam_search`.

  Returns:
    int32 [batch, L]: tokens up to and including eos, then 0.

  Raises:
    ValueError: on batch_size or max_decode_len < 1, eos_id = PAD_ID or
      output_vocab_size <= eos_id.
  """
  _check_search_args(batch_size, max_decode_len, eos_id, output_vocab_size)
  state = _GreedyState(step=jnp.array(0, jnp.int32), sequences=jnp.zeros(
      (batch_size, max_decode_len), jnp.int32), finished=jnp.zeros((batch_size,), bool),
                       cache=cache)

  def not_done(state: _GreedyState) -> jax.Array:
    return (state.step < max_decode_len) & ~jnp.all(state.finished)

  def step_fn(state: _GreedyState) -> _GreedyState:
    tokens = _previous_tokens(state.sequences, state.step)
    logits, cache = tokens_to_logits(tokens, state.step, state.cache)
    scores = _bound_length(_forbid_unemittable(logits, output_vocab_size), state.step, eos_id,
                           min_len, max_len)
    best = jnp.argmax(scores, axis=-1)
    next_tokens = jnp.where(state.finished, 0, best.astype(jnp.int32))
    return _GreedyState(step=state.step + 1,
                        sequences=state.sequences.at[:, state.step].set(next_tokens),
                        finished=state.finished | (next_tokens == eos_id), cache=cache)

  return jax.lax.while_loop(not_done, step_fn, state).sequences


def _prefix_tokens_to_logits(model: nnx.Module, encoded: jax.Array,
                             inputs: jax.Array) -> TokensToLogits:
  """Decoding without a cache: every step reruns the decoder over the whole output buffer.

  The "cache" is that buffer, int32 [n, max_decode_len]: step t writes the token of step t - 1
  into it and reads the logits at position t (later positions are causally masked out). This is
  what a jitted search without a cache costs; it is the reference the cached search must equal.
  """
  def tokens_to_logits(tokens: jax.Array, step: jax.Array,
                       prefix: jax.Array) -> tuple[jax.Array, jax.Array]:
    prefix = jax.lax.dynamic_update_slice(prefix, tokens[:, None], (0, jnp.maximum(step - 1, 0)))
    logits = model.decode(encoded, inputs, prefix, targets_segmentation=jnp.ones_like(prefix))
    return jax.lax.dynamic_index_in_dim(logits, step, axis=1, keepdims=False), prefix

  return tokens_to_logits


@functools.partial(
    jax.jit, static_argnames=("graphdef", "beam_size", "alpha", "max_decode_len", "eos_id",
                              "use_cache", "output_vocab_size"))
def _translate(graphdef: nnx.GraphDef, state: nnx.State, inputs: jax.Array, *, beam_size: int,
               alpha: float, max_decode_len: int, eos_id: int, use_cache: bool,
               output_vocab_size: int | None, min_len: jax.Array | None,
               max_len: jax.Array | None) -> jax.Array:
  """Jitted body of `translate` (the model travels as graphdef + state)."""
  model = nnx.merge(graphdef, state)
  batch_size = inputs.shape[0]
  tile = functools.partial(jnp.repeat, repeats=beam_size, axis=0)
  encoded, inputs = tile(model.encode(inputs)), tile(inputs)
  if use_cache:

    def tokens_to_logits(tokens: jax.Array, step: jax.Array, cache: Any) -> tuple[jax.Array, Any]:
      return model.decode_step(encoded, inputs, tokens, step, cache)

    cache = model.init_cache(batch_size * beam_size, max_decode_len)
  else:
    tokens_to_logits = _prefix_tokens_to_logits(model, encoded, inputs)
    cache = jnp.zeros((batch_size * beam_size, max_decode_len), jnp.int32)
  bounds = {"min_len": min_len, "max_len": max_len}
  if beam_size == 1:
    return greedy_search(tokens_to_logits, cache, batch_size=batch_size, eos_id=eos_id,
                         max_decode_len=max_decode_len, output_vocab_size=output_vocab_size,
                         **bounds)
  sequences, _ = beam_search(tokens_to_logits, cache, batch_size=batch_size, beam_size=beam_size,
                             alpha=alpha, eos_id=eos_id, max_decode_len=max_decode_len,
                             output_vocab_size=output_vocab_size, **bounds)
  return sequences[:, 0]


def translate(model: nnx.Module, inputs: jax.Array, *, beam_size: int = 4, alpha: float = 0.6,
              max_decode_len: int, eos_id: int = 1, use_cache: bool = True,
              output_vocab_size: int | None = None, min_len: jax.Array | None = None,
              max_len: jax.Array | None = None) -> jax.Array:
  """Encodes `inputs` once and decodes them with the cached decoder of `model`.

  Compiled once per (model structure, input shape, search settings); later batches of the same
  shape reuse the compiled search.

  Args:
    model: a `relpos.model.Transformer` (needs encode, init_cache, decode_step and
      check_decode_len).
    inputs: int32 [batch, src_len] source tokens, 0 = padding.
    beam_size: beams per input; 1 decodes greedily.
    alpha: GNMT length penalty exponent (beam search only).
    max_decode_len: the most output tokens per sentence (eos included).
    eos_id: end-of-sequence token.
    use_cache: False reruns the decoder over the whole output buffer at every step (the
      reference for the cache, and the baseline of the decoding benchmark).
    output_vocab_size: the tokenizer's size; ids >= it are never emitted (None: every id of
      the model's vocabulary).
    min_len, max_len: None, or int32 [batch]: the fewest and most output tokens (eos
      included) per input; both set to the reference's token length is oracle-length decoding
      (`beam_search`). max_len must not exceed max_decode_len.

  Returns:
    int32 [batch, max_decode_len]: the best hypothesis per input, eos-terminated (unless
    max_decode_len was reached) and padded with 0.

  Raises:
    ValueError: on beam_size or max_decode_len < 1, max_decode_len above the model's max_len
      (cached or not), alpha < 0, eos_id = PAD_ID, output_vocab_size <= eos_id, inputs not
      [batch, src_len >= 1], or length bounds not [batch] with 1 <= min_len <= max_len <=
      max_decode_len.
  """
  if beam_size < 1:
    raise ValueError(f"beam_size must be >= 1, got {beam_size}.")
  as_array = lambda bound: None if bound is None else jnp.asarray(bound, jnp.int32)
  inputs, min_len, max_len = jnp.asarray(inputs, jnp.int32), as_array(min_len), as_array(max_len)
  _check_translate_args(model, inputs, max_decode_len, min_len, max_len)
  graphdef, state = nnx.split(model)
  return _translate(graphdef, state, inputs, beam_size=beam_size, alpha=float(alpha),
                    max_decode_len=max_decode_len, eos_id=eos_id, use_cache=use_cache,
                    output_vocab_size=output_vocab_size, min_len=min_len, max_len=max_len)


def _check_translate_args(model: nnx.Module, inputs: jax.Array, max_decode_len: int,
                          min_len: jax.Array | None, max_len: jax.Array | None) -> None:
  """What `translate` refuses before tracing (see its Raises); the bounds' values are read
  only where this process holds them whole (not across hosts, not traced)."""
  if inputs.ndim != 2 or inputs.shape[1] < 1:
    raise ValueError(f"inputs must be int32 [batch, src_len] with src_len >= 1, got shape "
                     f"{inputs.shape}.")
  model.check_decode_len(max_decode_len)
  bounds = {"min_len": min_len, "max_len": max_len}
  for name, bound in bounds.items():
    if bound is not None and bound.shape != inputs.shape[:1]:
      raise ValueError(f"{name} must be int32 [batch={inputs.shape[0]}], got shape "
                       f"{bound.shape}.")
  if any(
      isinstance(b, jax.core.Tracer) or not b.is_fully_addressable
      for b in bounds.values()
      if b is not None):
    return
  batch = inputs.shape[0]
  low = np.ones(batch, int) if min_len is None else np.asarray(min_len)
  high = np.full(batch, max_decode_len) if max_len is None else np.asarray(max_len)
  wrong = np.flatnonzero((low < 1) | (low > high) | (high > max_decode_len))
  if wrong.size:
    row = int(wrong[0])
    raise ValueError(f"length bounds must hold 1 <= min_len <= max_len <= max_decode_len="
                     f"{max_decode_len}; row {row} has min_len {low[row]}, max_len {high[row]}.")
