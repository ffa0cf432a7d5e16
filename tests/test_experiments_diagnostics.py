"""Tests for relpos.experiments.diagnostics: the length diagnostics against direct computations
(a word tokenizer stand-in, a tiny model)."""

import numpy as np
import pytest
from flax import nnx

from relpos.data import tokenizer as tokenizer_lib
from relpos.experiments import diagnostics

VOCAB = 16


class WordTokenizer:
  """One id per word (3 + its length), then eos: lengths are word counts."""
  def encode_batch(self, texts):
    return [[3 + len(w) % 10 for w in t.split()] + [tokenizer_lib.EOS_ID] for t in texts]


def test_length_statistics_by_source_length():
  sources = ["a b c", "a b c d", "a b c d e f g h", "a b c d e f g h i"]
  references = ["x y z", "x y z w", "x y z w v u", "x y z w v u t s"]
  hypotheses = ["x y", "x y z w", "x y z w v u t", "x y z w"]
  stats_ = diagnostics.length_statistics(WordTokenizer(), sources, hypotheses, references)
  # Hypotheses 2 + 4 + 7 + 4 = 17 tokens against 3 + 4 + 6 + 8 = 21.
  assert stats_["ratio"] == pytest.approx(17 / 21)
  assert (stats_["shorter"], stats_["longer"], stats_["num_sentences"]) == (0.5, 0.25, 4)
  assert stats_["unit"] == diagnostics.LENGTH_UNIT
  # Buckets of width ceil(7 / 4) = 2 words from 3: 3-4 and 7-8, then 9 (5-6 empty).
  by_length = stats_["by_source_length"]
  assert list(by_length) == ["3-4", "7-8", "9"]
  assert by_length["3-4"] == {"ratio": 6 / 7, "shorter": 0.5, "longer": 0.0, "num_sentences": 2}
  assert by_length["7-8"] == {"ratio": 7 / 6, "shorter": 0.0, "longer": 1.0, "num_sentences": 1}
  assert by_length["9"] == {"ratio": 0.5, "shorter": 1.0, "longer": 0.0, "num_sentences": 1}
  assert list(diagnostics.bleu_by_source_length(sources, hypotheses, references)) == list(by_length)


class BatchTask:
  """A task stand-in: `eval_batches` of fixed (inputs, targets) pairs."""
  def __init__(self, inputs, targets):
    self.inputs, self.targets = inputs, targets

  def eval_batches(self, split, batch_size, max_len=None):
    assert split == "test" and max_len
    for start in range(0, len(self.inputs), batch_size):
      yield {
          "inputs": self.inputs[start:start + batch_size],
          "targets": self.targets[start:start + batch_size]
      }


def test_token_accuracy_by_position_against_a_direct_count(tiny_model):
  """Targets partly the model's own predictions, so that the direct count holds right and
  wrong tokens at several positions, right and wrong eos, and padding the model predicts.

  The untrained tiny model mostly predicts its input token (PAD after BOS and on padding), and
  never eos: in a copy of it, eos's embedding is 1.01 times that of token `final`, so that eos
  is predicted where `final` was (the logits are products with the embedding), and a target
  `final` followed by eos has its eos predicted right."""
  final = 15
  model = nnx.clone(tiny_model)
  table = model.decoder.embed.embedding
  table[...] = table[...].at[tokenizer_lib.EOS_ID].set(1.01 * table[...][final])
  predict = nnx.jit(lambda module, inputs, targets: module(inputs, targets).argmax(-1))
  rng = np.random.default_rng(1)
  inputs = rng.integers(3, VOCAB, size=(4, 7)).astype(np.int32)
  targets = rng.integers(3, VOCAB, size=(4, 8)).astype(np.int32)
  lengths = [3, 8, 5, 1]  # target tokens, eos included
  for row, length in enumerate(lengths):
    targets[row, length - 1], targets[row, length:] = tokenizer_lib.EOS_ID, 0
    inputs[row, 4 + row % 3:] = 0
  targets[0, 1] = targets[2, 3] = final  # before eos: rows 0 and 2 end right
  targets[1, 2] = final  # mid-sentence: row 1 predicts eos at position 3, before its end
  for t in range(targets.shape[1]):  # a prediction depends on the targets before it alone
    predicted = np.asarray(predict(model, inputs, targets))
    for row, length in enumerate(lengths):
      if t < length - 1 and (row + t) % 2 == 0 and predicted[row, t] > tokenizer_lib.EOS_ID:
        targets[row, t] = predicted[row, t]
  predicted = np.asarray(predict(model, inputs, targets))  # one padded batch
  result = diagnostics.token_accuracy_by_position(  # two batches of two
      model, BatchTask(inputs, targets), "test", batch_size=2, num_positions=10)
  correct, count = np.zeros(10), np.zeros(10)
  eos, before_eos, early_eos = [], [], []
  for row, length in enumerate(lengths):
    right = predicted[row, :length] == targets[row, :length]
    correct[:length] += right
    count[:length] += 1
    eos.append(right[-1])
    before_eos += right[:-1].tolist()
    early_eos += (predicted[row, :length - 1] == tokenizer_lib.EOS_ID).tolist()
  assert 0 < sum(before_eos) < len(before_eos)  # right and wrong tokens besides eos,
  assert np.count_nonzero(correct) > 1  # right ones at more than one position,
  assert 0 < sum(eos) < len(eos)  # right and wrong eos,
  assert (predicted[targets == 0] == 0).any()  # and padding "predicted", which does not count
  assert result["count"] == count.tolist()
  expected = [c / n if n else None for c, n in zip(correct, count)]
  assert result["accuracy"] == pytest.approx(expected)
  assert result["eos_accuracy"] == pytest.approx(np.mean(eos))
  assert 0 < sum(early_eos) and result["early_eos"] == pytest.approx(np.mean(early_eos))
  assert result["accuracy_all"] == pytest.approx(correct.sum() / count.sum())


def test_length_buckets_cover_every_sentence():
  sources = ["a b c", "a b c d e f", "a " * 11, "a " * 12]
  edges = diagnostics.length_edges(sources)
  assert edges == [3, 6, 9, 12]
  scores = diagnostics.bleu_by_source_length(sources, ["x y"] * 4, ["x y"] * 4)
  assert list(scores) == ["3-5", "6-8", "9-11", "12"]


def test_bleu_by_subset_scores_each_subset_alone():
  references = ["a b c d", "e f g h", "i j k l"]
  translations = ["a b c d", "x y z w", "i j k l"]
  scored = diagnostics.bleu_by_subset(translations, references, [("right", [0, 2]), ("wrong", [1]),
                                                                 ("none", [])], "de")
  assert scored["right"] == {"num_sentences": 2, "bleu": pytest.approx(100.0)}
  assert scored["wrong"]["num_sentences"] == 1 and scored["wrong"]["bleu"] == pytest.approx(0.0)
  assert scored["none"] == {"num_sentences": 0, "bleu": None}
