"""Tests for relpos.decode: beam search against exhaustive search, early stopping, greedy search.

The toy decoders are fixed tables of next-token logits; their cache carries what the logits
depend on (the row's batch index, or a code of the whole prefix), so a beam reordering bug in
the cache shows up as wrong scores.
"""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from relpos import decode

EOS = 1
PAD = 0  # never emitted
VOCAB = 4  # 0 (pad), 1 (eos), 2, 3


def log_softmax(x: np.ndarray) -> np.ndarray:
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def penalty(length: int, alpha: float) -> float:
  return ((5.0 + length) / 6.0)**alpha


def prefix_decoder(table: np.ndarray):
  """A decoder whose logits depend on the whole prefix.

  Args:
    table: [batch, L, VOCAB ** (L - 1), VOCAB] logits indexed by (batch, step, prefix code).

  Returns:
    (tokens_to_logits, cache for `beams` hypotheses per input) as a function of beams.
  """
  table = jnp.asarray(table)

  def tokens_to_logits(tokens, step, cache):
    code = jnp.where(step > 0, cache["code"] * VOCAB + tokens, 0)
    return table[cache["batch"], step, code], {"code": code, "batch": cache["batch"]}

  def init_cache(beams):
    rows = jnp.repeat(jnp.arange(table.shape[0], dtype=jnp.int32), beams)
    return {"code": jnp.zeros_like(rows), "batch": rows}

  return tokens_to_logits, init_cache


def previous_token_decoder(table: np.ndarray):
  """A decoder whose logits depend on (batch, step, previous token): table [batch, L, V, V]."""
  table = jnp.asarray(table)

  def tokens_to_logits(tokens, step, cache):
    return table[cache["batch"], step, tokens], cache

  def init_cache(beams):
    return {"batch": jnp.repeat(jnp.arange(table.shape[0], dtype=jnp.int32), beams)}

  return tokens_to_logits, init_cache


def sequence_log_prob(table: np.ndarray, sequence: np.ndarray, *, by_prefix: bool) -> float:
  """Log-probability of one eos-terminated (or full-length) sequence under a toy table [L, ...]."""
  total, code, previous = 0.0, 0, 0
  for step, token in enumerate(sequence):
    row = table[step, code] if by_prefix else table[step, previous]
    total += log_softmax(row)[token]
    if token == EOS:
      break
    code, previous = code * VOCAB + token, token
  return total


def exhaustive_search(table: np.ndarray, alpha: float) -> list[tuple[float, list[int]]]:
  """Every finished sequence of a prefix table [L, codes, V] with its score: those that end
  with eos best first, then those cut at L without it, best first."""
  length = table.shape[0]
  results = []
  for tokens in itertools.product(range(VOCAB), repeat=length):
    end = tokens.index(EOS) + 1 if EOS in tokens else length
    if EOS in tokens[end:] or any(tokens[end:]) or PAD in tokens[:end]:
      continue  # Each finished sequence once: padding 0 after eos (or none), never before.
    sequence = list(tokens[:end]) + [0] * (length - end)
    score = sequence_log_prob(table, tokens[:end], by_prefix=True) / penalty(end, alpha)
    results.append((score, sequence))
  return sorted(results, key=lambda r: (EOS not in r[1], -r[0]))


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_full_width_beam_search_equals_exhaustive_search(alpha):
  length, batch = 4, 2
  beam = 2**(length - 1)  # every live prefix (of tokens 2 and 3) fits: the search is exact.
  table = np.random.default_rng(0).normal(size=(batch, length, VOCAB**(length - 1), VOCAB))
  tokens_to_logits, init_cache = prefix_decoder(table * 2.0)
  sequences, scores = decode.beam_search(tokens_to_logits, init_cache(beam), batch_size=batch,
                                         beam_size=beam, alpha=alpha, max_decode_len=length)
  for b in range(batch):
    expected = exhaustive_search(table[b] * 2.0, alpha)[:beam]
    np.testing.assert_allclose(scores[b], [s for s, _ in expected], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(sequences[b], [seq for _, seq in expected])


def test_narrow_beam_scores_are_penalized_log_probs():
  length, batch, beam, alpha = 4, 2, 2, 0.6
  table = np.random.default_rng(1).normal(size=(batch, length, VOCAB**(length - 1), VOCAB))
  tokens_to_logits, init_cache = prefix_decoder(table)
  sequences, scores = decode.beam_search(tokens_to_logits, init_cache(beam), batch_size=batch,
                                         beam_size=beam, alpha=alpha, max_decode_len=length)
  assert sequences.shape == (batch, beam, length) and sequences.dtype == jnp.int32
  assert scores.shape == (batch, beam) and scores.dtype == jnp.float32
  for b in range(batch):
    ended = [EOS in sequence for sequence in np.asarray(sequences[b])]
    assert ended == sorted(ended, reverse=True)  # those with eos first
    if ended[0] == ended[1]:
      assert scores[b, 0] >= scores[b, 1]
    for sequence, score in zip(np.asarray(sequences[b]), np.asarray(scores[b])):
      end = list(sequence).index(EOS) + 1 if EOS in sequence else length
      assert not sequence[end:].any()
      expected = sequence_log_prob(table[b], sequence[:end], by_prefix=True) / penalty(end, alpha)
      np.testing.assert_allclose(score, expected, rtol=1e-5)


@pytest.mark.parametrize("alpha, beam", [(0.0, 2), (0.6, 4), (1.0, 4)])
def test_a_hypothesis_cut_at_the_budget_never_beats_one_that_ended(alpha, beam):
  """Step 0: token 2 or 3, even odds. After 2, eos is likely (0.6); after 3, 3 again (0.99),
  a loop that reaches the budget without eos. Scored as finished at the budget, the loop
  (log 0.5 + 19 log 0.99 = -0.88, never paying for an eos) beat "2 eos" (log 0.5 + log 0.6 =
  -1.20)."""
  length = 20
  table = np.full((1, length, VOCAB, VOCAB), -30.0)
  table[0, 0, 0, [2, 3]] = 0.0
  table[0, 1:, 2, EOS], table[0, 1:, 2, 2] = np.log(0.6), np.log(0.4)
  table[0, 1:, 3, 3], table[0, 1:, 3, EOS] = np.log(0.99), np.log(0.01)
  tokens_to_logits, init_cache = previous_token_decoder(table)
  sequences, scores = decode.beam_search(tokens_to_logits, init_cache(beam), batch_size=1,
                                         beam_size=beam, alpha=alpha, max_decode_len=length)
  assert list(np.asarray(sequences)[0, 0, :3]) == [2, EOS, 0]
  np.testing.assert_allclose(scores[0, 0], np.log(0.5 * 0.6) / penalty(2, alpha), rtol=1e-4)
  # With no eos allowed at all, the cut hypotheses are what there is.
  no_eos = table.copy()
  no_eos[0, :, :, EOS] = -np.inf
  tokens_to_logits, init_cache = previous_token_decoder(no_eos)
  sequences, scores = decode.beam_search(tokens_to_logits, init_cache(beam), batch_size=1,
                                         beam_size=beam, alpha=alpha, max_decode_len=length)
  assert list(np.asarray(sequences)[0, 0]) == [2] * length and scores[0, 0] > -np.inf


def early_stop_table(later_other_logit: float, length: int = 10) -> np.ndarray:
  """Step 0 prefers token 2, then 3, then eos; later steps prefer eos over the others."""
  table = np.full((1, length, VOCAB, VOCAB), later_other_logit)
  table[:, :, :, EOS] = 0.0
  table[:, 0, :, :] = [-10.0, -5.0, -0.1, -2.5]
  return table


def run_counting_steps(table: np.ndarray, alpha: float, beam: int):
  """Beam search over a previous-token table; returns (sequences, scores, steps evaluated)."""
  tokens_to_logits, init_cache = previous_token_decoder(table)
  steps = []

  def counting(tokens, step, cache):
    jax.debug.callback(lambda s: steps.append(int(s)), step)
    return tokens_to_logits(tokens, step, cache)

  sequences, scores = decode.beam_search(counting, init_cache(beam), batch_size=1, beam_size=beam,
                                         alpha=alpha, max_decode_len=table.shape[1])
  return np.asarray(sequences), np.asarray(scores), sorted(steps)


def test_beam_search_stops_when_no_live_beam_can_win():
  sequences, scores, steps = run_counting_steps(early_stop_table(-20.0), alpha=0.6, beam=2)
  assert steps == [0, 1]  # after step 1 live beams have log-prob ~-20: no chance.
  np.testing.assert_array_equal(sequences[0, :, :3], [[2, EOS, 0], [3, EOS, 0]])
  assert not sequences[0, :, 2:].any()
  table = early_stop_table(-20.0)[0]
  for sequence, score in zip(sequences[0], scores[0]):
    expected = sequence_log_prob(table, sequence[:2], by_prefix=False) / penalty(2, 0.6)
    np.testing.assert_allclose(score, expected, rtol=1e-5)


def test_beam_search_continues_while_a_live_beam_can_win():
  # Live beams at log-prob ~-3.2 could still beat the worst finished one (~-2.5 / penalty(2))
  # once divided by the larger penalty of longer lengths, so the search must go on.
  _, scores, steps = run_counting_steps(early_stop_table(-3.0), alpha=0.6, beam=2)
  assert steps[:3] == [0, 1, 2]
  assert scores[0, 0] >= scores[0, 1] > -jnp.inf


def test_eos_at_first_step_and_padding():
  table = np.zeros((1, 5, VOCAB, VOCAB))
  table[..., EOS] = 5.0  # eos is by far the most likely token everywhere.
  tokens_to_logits, init_cache = previous_token_decoder(table)
  sequences, scores = decode.beam_search(tokens_to_logits, init_cache(3), batch_size=1, beam_size=3,
                                         alpha=0.6, max_decode_len=5)
  np.testing.assert_array_equal(sequences[0, 0], [EOS, 0, 0, 0, 0])
  np.testing.assert_allclose(scores[0, 0],
                             log_softmax(table[0, 0, 0])[EOS] / penalty(1, 0.6), rtol=1e-5)
  assert (np.asarray(sequences[0, 1:, 1]) == EOS).all()  # then x, eos for the two runners-up


def greedy_reference(table: np.ndarray) -> np.ndarray:
  """Argmax decoding of a previous-token table [batch, L, V, V], padded with 0 after eos."""
  batch, length = table.shape[:2]
  out = np.zeros((batch, length), np.int32)
  for b in range(batch):
    previous = 0
    for step in range(length):
      previous = out[b, step] = np.argmax(np.delete(table[b, step, previous], PAD)) + 1
      if previous == EOS:
        break
  return out


def test_greedy_search_matches_argmax_reference():
  table = np.random.default_rng(2).normal(size=(3, 6, VOCAB, VOCAB))
  tokens_to_logits, init_cache = previous_token_decoder(table)
  sequences = decode.greedy_search(tokens_to_logits, init_cache(1), batch_size=3, max_decode_len=6)
  expected = greedy_reference(table)
  assert (expected == EOS).any(axis=1).sum() >= 2  # the case covers eos termination.
  np.testing.assert_array_equal(sequences, expected)


def test_beam_size_one_equals_greedy():
  # With alpha = 0 and eos possible only where it is the argmax, a single beam never finishes
  # early off the greedy path and stops exactly where greedy search stops.
  table = np.random.default_rng(3).normal(size=(4, 7, VOCAB, VOCAB))
  eos_is_best = table.argmax(-1) == EOS
  table[..., EOS] = np.where(eos_is_best, table[..., EOS], -1e9)
  tokens_to_logits, init_cache = previous_token_decoder(table)
  sequences, _ = decode.beam_search(tokens_to_logits, init_cache(1), batch_size=4, beam_size=1,
                                    alpha=0.0, max_decode_len=7)
  greedy = decode.greedy_search(tokens_to_logits, init_cache(1), batch_size=4, max_decode_len=7)
  np.testing.assert_array_equal(sequences[:, 0], greedy)
  np.testing.assert_array_equal(greedy, greedy_reference(table))


def test_searches_never_emit_ids_beyond_the_output_vocabulary():
  # Token 3 (beyond output_vocab_size=3) has the highest logit everywhere, eos the second.
  table = np.random.default_rng(4).normal(size=(2, 5, VOCAB, VOCAB))
  table[..., 3] = 10.0
  table[..., EOS] = 5.0
  tokens_to_logits, init_cache = previous_token_decoder(table)
  unmasked = decode.greedy_search(tokens_to_logits, init_cache(1), batch_size=2, max_decode_len=5)
  np.testing.assert_array_equal(unmasked[:, 0], [3, 3])  # the case bites without the mask
  greedy = decode.greedy_search(tokens_to_logits, init_cache(1), batch_size=2, max_decode_len=5,
                                output_vocab_size=3)
  np.testing.assert_array_equal(greedy, [[EOS, 0, 0, 0, 0]] * 2)
  sequences, scores = decode.beam_search(tokens_to_logits, init_cache(2), batch_size=2, beam_size=2,
                                         alpha=0.6, max_decode_len=5, output_vocab_size=3)
  assert np.asarray(sequences).max() <= 2
  for b in range(2):
    # Scores stay the log-probabilities of the full softmax the model was trained with.
    expected = log_softmax(table[b, 0, 0])[EOS] / penalty(1, 0.6)
    np.testing.assert_allclose(scores[b, 0], expected, rtol=1e-5)
    np.testing.assert_array_equal(sequences[b, 0], [EOS, 0, 0, 0, 0])
    end = list(np.asarray(sequences[b, 1])).index(EOS) + 1
    np.testing.assert_allclose(
        scores[b, 1],
        sequence_log_prob(table[b], sequences[b, 1, :end], by_prefix=False) / penalty(end, 0.6),
        rtol=1e-5)


def test_searches_never_emit_padding():
  # Pad has the highest logit everywhere; the searches emit the best of the other ids.
  table = np.random.default_rng(6).normal(size=(2, 5, VOCAB, VOCAB))
  table[..., PAD] = 10.0
  tokens_to_logits, init_cache = previous_token_decoder(table)
  greedy = decode.greedy_search(tokens_to_logits, init_cache(1), batch_size=2, max_decode_len=5)
  np.testing.assert_array_equal(greedy, greedy_reference(table))
  sequences, scores = decode.beam_search(tokens_to_logits, init_cache(2), batch_size=2, beam_size=2,
                                         alpha=0.6, max_decode_len=5)
  for b, k in itertools.product(range(2), range(2)):
    sequence = list(np.asarray(sequences[b, k]))
    end = sequence.index(EOS) + 1 if EOS in sequence else len(sequence)
    assert PAD not in sequence[:end] and not any(sequence[end:])
    np.testing.assert_allclose(
        scores[b, k],
        sequence_log_prob(table[b], sequence[:end], by_prefix=False) / penalty(end, 0.6), rtol=1e-5)


@pytest.mark.parametrize("kwargs, message", [
    ({"beam_size": 0}, "beam_size"),
    ({"alpha": -0.5}, "alpha"),
    ({"max_decode_len": 0}, "max_decode_len"),
    ({"batch_size": 0}, "batch_size"),
    ({"output_vocab_size": 1}, "output_vocab_size must exceed eos_id=1"),
    ({"eos_id": 0}, "eos_id must not be the padding id 0"),
])
def test_invalid_search_arguments(kwargs, message):
  tokens_to_logits, init_cache = previous_token_decoder(np.zeros((1, 3, VOCAB, VOCAB)))
  args = {"batch_size": 1, "beam_size": 2, "alpha": 0.6, "max_decode_len": 3, **kwargs}
  with pytest.raises(ValueError, match=message):
    decode.beam_search(tokens_to_logits, init_cache(2), **args)


def bounded_exhaustive_search(table: np.ndarray, alpha: float, low: int,
                              high: int) -> list[tuple[float, list[int]]]:
  """`exhaustive_search` of the sequences that end with eos at a length in [low, high]."""
  return [(score, sequence)
          for score, sequence in exhaustive_search(table, alpha)
          if EOS in sequence and low <= sequence.index(EOS) + 1 <= high]


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_length_bounds_keep_exactly_the_sequences_of_allowed_length(alpha):
  # Full width: the bounded search is exact, so it equals the exhaustive search restricted to
  # the allowed lengths; row 0 and row 2 are oracle-length (min = max), row 1 a range.
  length, batch = 4, 3
  beam = 2**(length - 1)
  table = np.random.default_rng(5).normal(size=(batch, length, VOCAB**(length - 1), VOCAB))
  min_len, max_len = np.array([1, 2, 3]), np.array([1, 4, 3])
  tokens_to_logits, init_cache = prefix_decoder(table * 2.0)
  sequences, scores = decode.beam_search(tokens_to_logits, init_cache(beam), batch_size=batch,
                                         beam_size=beam, alpha=alpha, max_decode_len=length,
                                         min_len=min_len, max_len=max_len)
  for b in range(batch):
    expected = bounded_exhaustive_search(table[b] * 2.0, alpha, min_len[b], max_len[b])[:beam]
    found = len(expected)
    np.testing.assert_allclose(scores[b, :found], [s for s, _ in expected], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(sequences[b, :found], [seq for _, seq in expected])
    assert np.all(np.asarray(scores[b, found:]) == -np.inf)
    assert not np.asarray(sequences[b, found:]).any()
  # Oracle rows: every hypothesis found (1 of length 1, 2 * 2 of length 3) has that length.
  valid = np.asarray(scores) > -np.inf
  assert valid[0].sum() == 1 and valid[2].sum() == 4
  assert (np.asarray(sequences[0])[valid[0], 0] == EOS).all()
  assert (np.asarray(sequences[2])[valid[2], 2] == EOS).all()


def test_oracle_length_outputs_have_the_given_length_where_eos_would_come_early():
  # eos is by far the best token everywhere: unbounded, every output is [eos]; bounded, each
  # ends exactly at its length.
  table = np.zeros((3, 6, VOCAB, VOCAB))
  table[..., EOS] = 5.0
  tokens_to_logits, init_cache = previous_token_decoder(table)
  lengths = np.array([2, 6, 4])
  for beam in (1, 3):
    cache = init_cache(beam)
    if beam == 1:
      best = decode.greedy_search(tokens_to_logits, cache, batch_size=3, max_decode_len=6,
                                  min_len=lengths, max_len=lengths)
    else:
      best = decode.beam_search(tokens_to_logits, cache, batch_size=3, beam_size=beam,
                                max_decode_len=6, min_len=lengths, max_len=lengths)[0][:, 0]
    best = np.asarray(best)
    for row, length in zip(best, lengths):
      assert list(row).index(EOS) == length - 1  # eos at the reference's last position
      assert (row[:length - 1] != EOS).all() and not row[length:].any()


def test_bounds_that_allow_every_length_change_nothing_bitwise():
  table = np.random.default_rng(6).normal(size=(3, 6, VOCAB, VOCAB))
  table[..., EOS] += 1.0  # some outputs end early
  tokens_to_logits, init_cache = previous_token_decoder(table)
  loose = {"min_len": np.ones(3, np.int32), "max_len": np.full(3, 6, np.int32)}
  plain = decode.beam_search(tokens_to_logits, init_cache(2), batch_size=3, beam_size=2,
                             max_decode_len=6)
  bounded = decode.beam_search(tokens_to_logits, init_cache(2), batch_size=3, beam_size=2,
                               max_decode_len=6, **loose)
  assert (np.asarray(plain[0]) == EOS).any(axis=-1).all()
  for want, got in zip(plain, bounded):
    assert np.array_equal(np.asarray(want), np.asarray(got))  # bitwise, scores included
  greedy = decode.greedy_search(tokens_to_logits, init_cache(1), batch_size=3, max_decode_len=6)
  np.testing.assert_array_equal(
      greedy,
      decode.greedy_search(tokens_to_logits, init_cache(1), batch_size=3, max_decode_len=6,
                           **loose))
