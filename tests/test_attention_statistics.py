"""Tests for relpos.attention_statistics: what a model's position parameters and attention say,
against direct computations on a tiny model."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from scipy import stats

from configs import default
from relpos import model as model_lib
from relpos import model_config
from relpos.data import tokenizer as tokenizer_lib
from relpos import attention_statistics

VOCAB = 16


def test_attention_entropy_equals_scipy_on_valid_queries():
  rng = np.random.default_rng(0)
  valid = np.array([[True] * 5, [True] * 3 + [False] * 2])
  logits = rng.normal(size=(2, 3, 5, 5))
  weights = np.exp(logits) * valid[:, None, None, :]
  weights /= weights.sum(-1, keepdims=True)
  by_query, count = attention_statistics.attention_entropy(weights, valid)
  np.testing.assert_array_equal(count, [2, 2, 2, 1, 1])
  for i in range(5):
    rows = [b for b in range(2) if valid[b, i]]
    expected = np.mean([stats.entropy(weights[b, h, i]) for b in rows for h in range(3)])
    np.testing.assert_allclose(by_query[i], expected, rtol=1e-6)


def _direct_position_statistics(model, inputs):
  """"qak_by_offset", "max_distance" and "t5_bias" computed directly from the parameters."""
  valid = inputs != tokenizer_lib.PAD_ID
  layers = list(attention_statistics._encoder_attention(model, inputs))  # pylint: disable=protected-access
  expected = {}
  for attention, sublayer_input, _ in layers:
    position = attention.position
    if getattr(position, "rel_key", None) is not None:
      query = attention.query(sublayer_input)  # [batch, n, heads, depth]
      table = position.rel_key[...]
      spec = "bnhd,rd->bnhr" if table.ndim == 2 else "bnhd,hrd->bnhr"  # -> [b, n, h, 2k+1]
      scaled = query * attention.head_dim**-0.5  # before the product, as the kernel's logits
      logits = np.asarray(jnp.einsum(spec, scaled, table))
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
  statistics = attention_statistics.position_statistics(model, inputs)
  expected = _direct_position_statistics(model, inputs)
  assert set(statistics) == {"offsets", "attention_by_offset", "longest_distance", *expected}
  assert {k: statistics[k] for k in expected} == expected  # bit for bit
  assert statistics["longest_distance"] == 4  # the first sentence's 5 tokens
  if "qak_by_offset" in expected:
    assert len(expected["qak_by_offset"]) == 2 and len(expected["qak_by_offset"][0]) == 5


def test_attention_profile_normalized_entropy_of_a_tiny_model(tiny_model):
  inputs = np.array([[3, 4, 5, 6, 1, 0], [7, 8, 1, 0, 0, 0]], np.int32)
  profile = attention_statistics.attention_profile(tiny_model, inputs)
  assert len(profile["entropy_by_query"]) == len(profile["normalized_entropy"]) == 2
  assert profile["count_by_query"] == [2, 2, 2, 1, 1, 0]
  assert profile["entropy_by_query"][0][5] is None and profile["mean_length"] == 4.0
  valid = inputs != 0
  layers = list(attention_statistics._encoder_attention(tiny_model, inputs))  # pylint: disable=protected-access
  for layer, (_, _, weights) in enumerate(layers):
    entropy = [[stats.entropy(weights[b, h, i][valid[b]])
                for h in range(2)]
               for b in range(2)
               for i in range(6)
               if valid[b, i]]
    logs = [np.log(valid[b].sum()) for b in range(2) for i in range(6) if valid[b, i]]
    expected = np.mean(np.mean(entropy, axis=1) / np.array(logs))
    np.testing.assert_allclose(profile["normalized_entropy"][layer], expected, rtol=1e-5)


def test_mean_by_offset_equals_a_loop_over_the_pairs_inside_each_sentence():
  rng = np.random.default_rng(1)
  valid = np.array([[True] * 6, [True] * 4 + [False] * 2, [True] * 2 + [False] * 4])
  weights = rng.random((3, 2, 6, 6))
  means = attention_statistics._mean_by_offset(weights, valid)  # pylint: disable=protected-access
  for offset, mean in zip(
      range(-attention_statistics.MAX_OFFSET, attention_statistics.MAX_OFFSET + 1), means):
    pairs = [
        weights[b, h, i, i + offset]
        for b in range(3)
        for h in range(2)
        for i in range(6)
        if 0 <= i + offset < 6 and valid[b, i] and valid[b, i + offset]
    ]
    if pairs:
      assert mean == pytest.approx(np.mean(pairs), rel=1e-12), offset
    else:  # |offset| >= 6: no pair
      assert mean is None, offset
  assert means[attention_statistics.MAX_OFFSET + 5] is not None  # only the first sentence's


def test_encoder_attention_replays_the_encoder_layer_by_layer(tiny_model, monkeypatch):
  """The sublayer inputs `_encoder_attention` yields are those the encoder's self-attention
  receives in `Transformer.encode`, and a token's weights put nothing on padding keys."""
  inputs = np.array([[3, 4, 5, 6, 1, 0], [7, 8, 1, 0, 0, 0]], np.int32)
  attention_class = type(tiny_model.encoder.layers[0].self_attention)
  call, received = attention_class.__call__, []

  def recording(self, x, **kwargs):
    received.append(np.asarray(x))
    return call(self, x, **kwargs)

  monkeypatch.setattr(attention_class, "__call__", recording)
  tiny_model.encode(jnp.asarray(inputs))
  monkeypatch.undo()
  layers = list(attention_statistics._encoder_attention(tiny_model, inputs))  # pylint: disable=protected-access
  assert len(received) == len(layers) == 2
  valid = inputs != 0
  for given, (_, sublayer_input, weights) in zip(received, layers):
    # Compared on tokens: padding rows attend differently in the two, and no token reads them.
    np.testing.assert_allclose(
        np.asarray(sublayer_input)[valid], given[valid], rtol=1e-6, atol=1e-6)
    tokens_attending = weights.transpose(0, 2, 1, 3)[valid]  # [valid queries, heads, n]
    np.testing.assert_array_equal(tokens_attending * ~valid.repeat([5, 3], 0)[:, None], 0)
    np.testing.assert_allclose(tokens_attending.sum(-1), 1, rtol=1e-5)
