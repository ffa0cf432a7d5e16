"""Tests for relpos.experiments.diagnostics and analysis.attention_profile /
position_statistics: the length diagnostics and the encoder's statistics against direct
computations (a word tokenizer stand-in, a tiny model)."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from scipy import stats

from configs import default
from relpos import model as model_lib
from relpos import model_config
from relpos.data import tokenizer as tokenizer_lib
from relpos.experiments import analysis
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


def test_attention_entropy_equals_scipy_on_valid_queries():
  rng = np.random.default_rng(0)
  valid = np.array([[True] * 5, [True] * 3 + [False] * 2])
  logits = rng.normal(size=(2, 3, 5, 5))
  weights = np.exp(logits) * valid[:, None, None, :]
  weights /= weights.sum(-1, keepdims=True)
  by_query, count = analysis.attention_entropy(weights, valid)
  np.testing.assert_array_equal(count, [2, 2, 2, 1, 1])
  for i in range(5):
    rows = [b for b in range(2) if valid[b, i]]
    expected = np.mean([stats.entropy(weights[b, h, i]) for b in rows for h in range(3)])
    np.testing.assert_allclose(by_query[i], expected, rtol=1e-6)


@pytest.fixture(scope="module")
def tiny_model():
  model_cfg = {
      **default.get_config().model.to_dict(), "emb_dim": 16, "num_heads": 2, "qkv_dim": 16,
      "mlp_dim": 32, "num_encoder_layers": 2, "num_decoder_layers": 1, "max_len": 32,
      "max_relative_position": 2
  }
  return model_lib.Transformer(model_config.TransformerConfig.from_config(model_cfg, VOCAB),
                               rngs=nnx.Rngs(0))


def _direct_position_statistics(model, inputs):
  """"qak_by_offset", "max_distance" and "t5_bias" computed directly from the parameters."""
  valid = inputs != tokenizer_lib.PAD_ID
  layers = list(analysis._encoder_attention(model, inputs))  # pylint: disable=protected-access
  expected = {}
  for attention, sublayer_input, _ in layers:
    position = attention.position
    if getattr(position, "rel_key", None) is not None:
      query = attention.query(sublayer_input)  # [batch, n, heads, depth]
      table = position.rel_key[...]
      spec = "bnhd,rd->bnhr" if table.ndim == 2 else "bnhd,hrd->bnhr"  # -> [b, n, h, 2k+1]
      logits = np.asarray(jnp.einsum(spec, query, table)) * attention.head_dim**-0.5
      expected.setdefault("qak_by_offset", []).append(((logits * valid[:, :, None, None]).sum(
          (0, 1, 2)) / (valid.sum() * logits.shape[2])).tolist())
      expected["max_distance"] = position.max_distance
  first = layers[0][0].position
  if hasattr(first, "num_buckets"):
    expected["t5_bias"] = np.asarray(first.embedding[...]).tolist()
  return expected


@pytest.mark.parametrize(
    "overrides", [{}, {"relative_per_head": True}, {"relative_key": False}, {"position": "t5"},
                  {"position": "t5", "t5_shared_across_layers": False}, {"position": "rope"}],
    ids=["relative", "relative_per_head", "relative_value_only", "t5", "t5_per_layer", "rope"])
def test_position_statistics_equal_the_parameters_read_directly(overrides):
  # head depth 12 (not a power of 2): the scaling by 1/sqrt(depth) rounds
  model_cfg = {
      **default.get_config().model.to_dict(), "emb_dim": 24, "num_heads": 2, "qkv_dim": 24,
      "mlp_dim": 32, "num_encoder_layers": 2, "num_decoder_layers": 1, "max_len": 32,
      "max_relative_position": 2, **overrides
  }
  model = model_lib.Transformer(model_config.TransformerConfig.from_config(model_cfg, VOCAB),
                                rngs=nnx.Rngs(0))
  inputs = np.array([[3, 4, 5, 6, 1, 0], [7, 8, 1, 0, 0, 0]], np.int32)
  statistics = analysis.position_statistics(model, inputs)
  expected = _direct_position_statistics(model, inputs)
  assert set(statistics) == {"offsets", "attention_by_offset", "longest_distance", *expected}
  assert {k: statistics[k] for k in expected} == expected  # bit for bit
  if "qak_by_offset" in expected:
    assert len(expected["qak_by_offset"]) == 2 and len(expected["qak_by_offset"][0]) == 5


def test_attention_profile_normalized_entropy_of_a_tiny_model(tiny_model):
  inputs = np.array([[3, 4, 5, 6, 1, 0], [7, 8, 1, 0, 0, 0]], np.int32)
  profile = analysis.attention_profile(tiny_model, inputs)
  assert len(profile["entropy_by_query"]) == len(profile["normalized_entropy"]) == 2
  assert profile["count_by_query"] == [2, 2, 2, 1, 1, 0]
  assert profile["entropy_by_query"][0][5] is None and profile["mean_length"] == 4.0
  valid = inputs != 0
  layers = list(analysis._encoder_attention(tiny_model, inputs))  # pylint: disable=protected-access
  for layer, (_, _, weights) in enumerate(layers):
    entropy = [[stats.entropy(weights[b, h, i][valid[b]])
                for h in range(2)]
               for b in range(2)
               for i in range(6)
               if valid[b, i]]
    logs = [np.log(valid[b].sum()) for b in range(2) for i in range(6) if valid[b, i]]
    expected = np.mean(np.mean(entropy, axis=1) / np.array(logs))
    np.testing.assert_allclose(profile["normalized_entropy"][layer], expected, rtol=1e-5)


class BatchTask:
  """A task stand-in: `eval_batches` of fixed (inputs, targets) pairs."""
  def __init__(self, inputs, targets):
    self.inputs, self.targets = inputs, targets

  def eval_batches(self, split, batch_size):
    assert split == "test"
    for start in range(0, len(self.inputs), batch_size):
      yield {
          "inputs": self.inputs[start:start + batch_size],
          "targets": self.targets[start:start + batch_size]
      }


def test_token_accuracy_by_position_against_a_direct_count(tiny_model):
  rng = np.random.default_rng(1)
  inputs = rng.integers(3, VOCAB, size=(4, 7)).astype(np.int32)
  targets = rng.integers(3, VOCAB, size=(4, 8)).astype(np.int32)
  lengths = [3, 8, 5, 1]  # target tokens, eos included
  for row, length in enumerate(lengths):
    targets[row, length - 1], targets[row, length:] = tokenizer_lib.EOS_ID, 0
    inputs[row, 4 + row % 3:] = 0
  predicted = np.asarray(tiny_model(inputs, targets).argmax(-1))  # one padded batch, eager
  result = diagnostics.token_accuracy_by_position(  # two batches of two, jitted
      tiny_model, BatchTask(inputs, targets), "test", batch_size=2, num_positions=10)
  correct, count = np.zeros(10), np.zeros(10)
  eos = []
  for row, length in enumerate(lengths):
    right = predicted[row, :length] == targets[row, :length]
    correct[:length] += right
    count[:length] += 1
    eos.append(right[-1])
  assert result["count"] == count.tolist()
  expected = [c / n if n else None for c, n in zip(correct, count)]
  assert result["accuracy"] == pytest.approx(expected)
  assert result["eos_accuracy"] == pytest.approx(np.mean(eos))
  assert result["accuracy_all"] == pytest.approx(correct.sum() / count.sum())


def test_length_buckets_cover_every_sentence():
  sources = ["a b c", "a b c d e f", "a " * 11, "a " * 12]
  edges = diagnostics.length_edges(sources)
  assert edges == [3, 6, 9, 12]
  scores = diagnostics.bleu_by_source_length(sources, ["x y"] * 4, ["x y"] * 4)
  assert list(scores) == ["3-5", "6-8", "9-11", "12"]
