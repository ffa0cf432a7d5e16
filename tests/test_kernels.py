"""Tests for relpos.kernels: the efficient Shaw et al. core against the paper's naive equations,
the distance structure, the additive-bias (cuDNN) path and its reasons not to run."""
import json
import math
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend import core as jax_core

from relpos import positions
from relpos.kernels import distances
from relpos.kernels import fused
from relpos.kernels import relative as kernel

# ../shared/reference/worked_example.json (outside the repository), embedded so that a clean clone
# runs the test; test_worked_example_copy_matches_shared_reference guards the copy.
SHARED_WORKED_EXAMPLE = (pathlib.Path(__file__).resolve().parents[2] /
                         "shared/reference/worked_example.json")
WORKED_EXAMPLE = {
    "d_k": 4,
    "bias_scale": 0.3,
    "raw_scores": [[0.0, 2.0, 1.0, 1.0, 1.5], [3.0, 0.0, 2.0, 1.0, 0.5], [1.0, 2.0, 2.0, 1.0, 1.5],
                   [1.0, 1.0, 0.0, 2.0, 1.0], [1.0, 1.0, 1.0, 1.0, 1.5]],
    "weights_without_bias": [[0.1095, 0.2976, 0.1805, 0.1805, 0.2318],
                             [0.4026, 0.0898, 0.2442, 0.1481, 0.1153],
                             [0.1519, 0.2505, 0.2505, 0.1519, 0.1951],
                             [0.1903, 0.1903, 0.1154, 0.3137, 0.1903],
                             [0.1892, 0.1892, 0.1892, 0.1892, 0.2430]],
    "weights_with_bias": [[0.1473, 0.3253, 0.1747, 0.1603, 0.1924],
                          [0.4099, 0.1126, 0.2486, 0.1335, 0.0954],
                          [0.1321, 0.2460, 0.3029, 0.1492, 0.1697],
                          [0.1523, 0.1660, 0.1137, 0.3805, 0.1875],
                          [0.1508, 0.1612, 0.1758, 0.1985, 0.3138]],
}
TOL = {"rtol": 2e-5, "atol": 2e-5}


def naive_relative_attention(query, key, value, rel_key, rel_value, max_distance, mask=None,
                             query_positions=None, key_positions=None, bias=None):
  """Shaw et al. (2018) eqs. 3-5 as written: a^K_ij and a^V_ij materialized per (i, j); a
  variant's `bias` ([q, k] or [batch or 1, heads or 1, q, k]) is added to the logits."""
  batch, q_len, heads, depth = query.shape
  kv_len = key.shape[1]
  qpos = jnp.broadcast_to(
      jnp.arange(q_len) if query_positions is None else query_positions, (batch, q_len))
  kpos = jnp.broadcast_to(
      jnp.arange(kv_len) if key_positions is None else key_positions, (batch, kv_len))
  distance = jnp.clip(kpos[:, None, :] - qpos[:, :, None], -max_distance, max_distance)
  row = distance + max_distance  # [b, q, k]

  def per_pair(table):  # -> [b, h, q, k, d]
    if table is None:
      return jnp.zeros((batch, heads, q_len, kv_len, depth))
    per_head = table if table.ndim == 3 else jnp.broadcast_to(table, (heads,) + table.shape)
    return jnp.stack([per_head[h][row] for h in range(heads)], axis=1)

  keys = jnp.swapaxes(key, 1, 2)[:, :, None] + per_pair(rel_key)  # k_j + a^K_ij
  values = jnp.swapaxes(value, 1, 2)[:, :, None] + per_pair(rel_value)  # v_j + a^V_ij
  logits = jnp.einsum("bqhd,bhqkd->bhqk", query, keys) / math.sqrt(depth)
  if bias is not None:
    logits = logits + bias
  if mask is not None:
    logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
  weights = jax.nn.softmax(logits, axis=-1)
  return jnp.einsum("bhqk,bhqkd->bqhd", weights, values)


def _normal(seed, shape):
  """Standard normal float32 array from numpy (avoids compiling a sampler per shape)."""
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape, dtype=np.float32))


def _random_inputs(seed, batch, q_len, kv_len, heads, depth, max_distance, per_head, terms):
  table_shape = ((heads,) if per_head else ()) + (2 * max_distance + 1, depth)
  return {
      "query": _normal(seed, (batch, q_len, heads, depth)),
      "key": _normal(seed + 1, (batch, kv_len, heads, depth)),
      "value": _normal(seed + 2, (batch, kv_len, heads, depth)),
      "rel_key": _normal(seed + 3, table_shape) if "key" in terms else None,
      "rel_value": _normal(seed + 4, table_shape) if "value" in terms else None,
  }


def _assert_matches_naive(cases):
  """Forward values and gradients w.r.t. query, key, value, tables (and bias) agree, for every
  case.

  Args:
    cases: list of (inputs from _random_inputs, with an optional "bias" entry, max_distance,
      attention kwargs); all cases are compiled together in one jit to keep the test fast.
  """
  max_distances = [max_distance for _, max_distance, _ in cases]

  @jax.jit
  def run(args):
    results = []
    for (inputs, kwargs, cotangent), max_distance in zip(args, max_distances):

      def efficient(a, kwargs=kwargs, max_distance=max_distance):
        return kernel.relative_dot_product_attention(a["query"], a["key"], a["value"],
                                                     rel_key=a["rel_key"], rel_value=a["rel_value"],
                                                     max_distance=max_distance, bias=a.get("bias"),
                                                     **kwargs)

      def naive(a, kwargs=kwargs, max_distance=max_distance):
        return naive_relative_attention(a["query"], a["key"], a["value"], a["rel_key"],
                                        a["rel_value"], max_distance, bias=a.get("bias"), **kwargs)

      for fn in (efficient, naive):
        out, vjp = jax.vjp(fn, inputs)
        results.append((out, vjp(cotangent)[0]))
    return results

  args = [(inputs, kwargs, _normal(7, inputs["query"].shape)) for inputs, _, kwargs in cases]
  results = run(args)
  for case, (inputs, max_distance, _) in enumerate(cases):
    (out, grads), (naive_out, naive_grads) = results[2 * case], results[2 * case + 1]
    np.testing.assert_allclose(out, naive_out, err_msg=f"k={max_distance}", **TOL)
    for name, grad in grads.items():
      if grad is None:
        assert inputs[name] is None
        continue
      assert float(jnp.abs(grad).max()) > 0, name
      np.testing.assert_allclose(grad, naive_grads[name], err_msg=f"{name}, k={max_distance}",
                                 **TOL)


@pytest.mark.parametrize("terms", ["key", "value", "key+value"])
@pytest.mark.parametrize("per_head", [False, True])
def test_efficient_matches_naive_with_padding_and_causal_mask(terms, per_head):
  valid = jnp.arange(5)[None, :] < jnp.array([5, 3])[:, None]  # [b, k]: second row padded
  mask = valid[:, None, None, :] & jnp.tril(jnp.ones((5, 5), bool))
  # k = 9 exceeds every distance in a length of 5.
  _assert_matches_naive([(_random_inputs(k, 2, 5, 5, 2, 4, k, per_head, terms), k, {"mask": mask})
                         for k in (0, 1, 3, 9)])


@pytest.mark.parametrize("per_head", [False, True])
def test_efficient_matches_naive_with_different_lengths(per_head):
  padding = (jnp.arange(6)[None] < jnp.array([[6], [4]]))[:, None, None, :]
  shorter_queries = [(_random_inputs(k, 2, 3, 6, 2, 4, k, per_head,
                                     "key+value"), k, {"mask": padding}) for k in (1, 3, 8)]
  longer_queries = [(_random_inputs(k, 1, 6, 3, 2, 4, k, per_head,
                                    "key+value"), k, {"query_positions": jnp.arange(6) + 2})
                    for k in (1, 3, 8)]
  _assert_matches_naive(shorter_queries + longer_queries)


@pytest.mark.parametrize("padding", ["attends_padding", "masked"])
def test_efficient_matches_naive_with_packed_positions(padding):
  # Two packed rows: segments [0 1 2 | 0 1 | pad pad] and [0 1 2 3 4 5 6].
  segments = jnp.array([[1, 1, 1, 2, 2, 0, 0], [1, 1, 1, 1, 1, 1, 1]])
  pos = jnp.array([[0, 1, 2, 0, 1, 0, 0], [0, 1, 2, 3, 4, 5, 6]])
  mask = (segments[:, :, None] == segments[:, None, :])[:, None]
  if padding == "masked":
    mask = mask & (segments[:, None, None, :] > 0)
  # Padding that attends to padding (as in relpos.model) makes rows of one distance, summed along
  # the shared pattern; fully masked padding rows weigh every key, so the per-pair index is used.
  structured = distances.distances_of(pos, pos, mask, 7, 7, 2).structured
  assert bool(structured) == (padding == "attends_padding")
  kwargs = {"mask": mask, "query_positions": pos, "key_positions": pos}
  # k = 9 > 6, the longest distance: only the middle rows of the tables are read.
  _assert_matches_naive([(_random_inputs(3, 2, 7, 7, 2, 4, k, per_head, terms), k, kwargs)
                         for terms, per_head in [("key", False), ("value",
                                                                  True), ("key+value", False)]
                         for k in (2, 9)])


def test_efficient_matches_naive_with_a_bias_and_tables():
  """A variant's bias (T5, ALiBi, FIRE, a plug-in's) added to the logits of the tables: per
  (batch, head), broadcast over the batch, and one [q, k] for all; outputs and the gradients of
  the bias (those variants learn it) and of the tables. k = 8 exceeds the span of positions
  1..5 against 0..5 (the middle rows only)."""
  padding = (jnp.arange(6)[None] < jnp.array([[6], [4]]))[:, None, None, :]
  cases = []
  for seed, (k, per_head, terms, bias_shape) in enumerate([(1, False, "key+value", (2, 2, 5, 6)),
                                                           (3, True, "key", (1, 2, 5, 6)),
                                                           (8, False, "key+value", (5, 6))]):
    inputs = _random_inputs(40 + seed, 2, 5, 6, 2, 4, k, per_head, terms)
    inputs["bias"] = _normal(50 + seed, bias_shape)
    cases.append((inputs, k, {"mask": padding, "query_positions": jnp.arange(5) + 1}))
  _assert_matches_naive(cases)


def test_tables_beyond_the_sequence_are_read_only_when_positions_reach_them():
  inputs = _random_inputs(5, 1, 4, 4, 2, 4, 6, False, "key+value")

  def table_grads(positions):
    def loss(tables):
      out = kernel.relative_dot_product_attention(inputs["query"], inputs["key"], inputs["value"],
                                                  max_distance=6, query_positions=positions,
                                                  key_positions=positions, **tables)
      return jnp.sum(out**2)

    return jax.grad(loss)({"rel_key": inputs["rel_key"], "rel_value": inputs["rel_value"]})

  near = table_grads(jnp.arange(4))  # distances -3..3: rows 3..9 of 13
  far = table_grads(jnp.array([0, 2, 4, 6]))  # distances -6, -4, ..., 6: the even rows
  offsets = jnp.arange(13) - 6
  for name in ("rel_key", "rel_value"):
    np.testing.assert_array_equal(jnp.abs(near[name]).sum(-1) > 0, jnp.abs(offsets) <= 3)
    np.testing.assert_array_equal(jnp.abs(far[name]).sum(-1) > 0, offsets % 2 == 0)


def test_packed_equals_unpacked():
  inputs = _random_inputs(4, 1, 5, 5, 2, 4, 2, True, "key+value")
  segments = jnp.array([[1, 1, 1, 2, 2]])
  pos = jnp.array([[0, 1, 2, 0, 1]])
  mask = (segments[:, :, None] == segments[:, None, :])[:, None]
  packed = kernel.relative_dot_product_attention(**inputs, max_distance=2, mask=mask,
                                                 query_positions=pos, key_positions=pos)
  for sl in (slice(0, 3), slice(3, 5)):
    alone = kernel.relative_dot_product_attention(inputs["query"][:, sl], inputs["key"][:, sl],
                                                  inputs["value"][:, sl], rel_key=inputs["rel_key"],
                                                  rel_value=inputs["rel_value"], max_distance=2)
    np.testing.assert_allclose(packed[:, sl], alone, **TOL)


def test_k_zero_is_one_vector_for_every_distance():
  inputs = _random_inputs(5, 2, 4, 4, 2, 4, 0, False, "key+value")
  out = kernel.relative_dot_product_attention(inputs["query"], inputs["key"], inputs["value"],
                                              rel_key=inputs["rel_key"],
                                              rel_value=inputs["rel_value"], max_distance=0)
  plain = jax.nn.dot_product_attention(inputs["query"], inputs["key"] + inputs["rel_key"][0],
                                       inputs["value"] + inputs["rel_value"][0])
  np.testing.assert_allclose(out, plain, **TOL)


def test_bfloat16_inputs_keep_their_dtype():
  inputs = _random_inputs(11, 1, 4, 4, 2, 4, 1, False, "key+value")
  low = {
      name: x.astype(jnp.bfloat16) if name in ("query", "key", "value") else x
      for name, x in inputs.items()
  }
  out = kernel.relative_dot_product_attention(**low, max_distance=1)
  assert out.dtype == jnp.bfloat16
  full = kernel.relative_dot_product_attention(
      **{name: x.astype(jnp.float32) for name, x in low.items()}, max_distance=1)
  # bfloat16 rounding of the products and the output: 0.010 measured on outputs up to 3.7
  np.testing.assert_allclose(out.astype(jnp.float32), full, atol=0.025)


def test_bfloat16_gradients_are_close_to_float32s():
  """The custom VJP accumulates its bfloat16 products in float32, as the forward's logits: the
  gradients of bfloat16 inputs stay within 0.5% (relative L2) of float32's on the same values
  (measured 0.2-0.45%; each product rounded to bfloat16 first gave 0.24-0.45%)."""
  inputs = _random_inputs(3, 2, 32, 32, 2, 16, 4, False, "key+value")
  low = {name: x.astype(jnp.bfloat16) for name, x in inputs.items()}

  def loss(args, dtype):
    out = kernel.relative_dot_product_attention(**{n: x.astype(dtype) for n, x in args.items()},
                                                max_distance=4)
    return jnp.sum(out.astype(jnp.float32) * jnp.cos(jnp.arange(out.size).reshape(out.shape)))

  low_grads = jax.grad(loss)(low, jnp.bfloat16)
  full_grads = jax.grad(loss)({n: x.astype(jnp.float32) for n, x in low.items()}, jnp.float32)
  for name, grad in low_grads.items():
    assert grad.dtype == jnp.bfloat16, name
    difference = np.asarray(grad, np.float32) - np.asarray(full_grads[name])
    assert np.linalg.norm(difference) < 0.005 * np.linalg.norm(full_grads[name]), name


def test_without_tables_matches_jax_dot_product_attention():
  inputs = _random_inputs(6, 2, 4, 6, 2, 4, 1, False, "")
  bias = _normal(7, (2, 2, 4, 6))
  mask = jnp.arange(6)[None, None, None, :] < jnp.array([6, 2])[:, None, None, None]
  out = kernel.relative_dot_product_attention(inputs["query"], inputs["key"], inputs["value"],
                                              bias=bias, mask=mask)
  want = jax.nn.dot_product_attention(inputs["query"], inputs["key"], inputs["value"], bias=bias,
                                      mask=mask)
  np.testing.assert_allclose(out, want, **TOL)


def test_worked_example_copy_matches_shared_reference():
  if not SHARED_WORKED_EXAMPLE.exists():
    pytest.skip(f"{SHARED_WORKED_EXAMPLE} not present (outside the repository)")
  shared = json.loads(SHARED_WORKED_EXAMPLE.read_text())
  assert {name: shared[name] for name in WORKED_EXAMPLE} == WORKED_EXAMPLE


def test_additive_bias_reproduces_worked_example():
  example = WORKED_EXAMPLE
  raw = jnp.asarray(example["raw_scores"], jnp.float32)
  n, d_k = raw.shape[0], example["d_k"]
  # Keys are the identity of depth n, so query . key_j / sqrt(n) = raw / sqrt(d_k).
  query = (raw * math.sqrt(n) / math.sqrt(d_k))[None, :, None, :]
  key = jnp.eye(n)[None, :, None, :]
  distance = jnp.abs(positions.relative_positions(jnp.arange(n), jnp.arange(n)))
  bias = -example["bias_scale"] * jnp.log1p(distance.astype(jnp.float32))
  for want, kwargs in [("weights_without_bias", {}), ("weights_with_bias", {"bias": bias})]:
    weights = kernel.relative_attention_weights(query, key, **kwargs)[0, 0]
    np.testing.assert_allclose(np.round(np.asarray(weights), 4), example[want], atol=1e-12)
    # The output path uses the same weights: with value = identity, out_i = weights[i].
    out = kernel.relative_dot_product_attention(query, key, key, **kwargs)[0, :, 0]
    np.testing.assert_allclose(out, weights, atol=1e-6)


def test_attention_dropout_drops_weights():
  inputs = _random_inputs(8, 1, 4, 4, 2, 4, 1, False, "key+value")
  rng = jax.random.key(9)
  out = kernel.relative_dot_product_attention(**inputs, max_distance=1, dropout_rate=0.5,
                                              dropout_rng=rng)
  weights = kernel.relative_attention_weights(inputs["query"], inputs["key"],
                                              rel_key=inputs["rel_key"], max_distance=1)
  kept = jnp.where(jax.random.bernoulli(rng, 0.5, weights.shape), weights / 0.5, 0.0)
  row = positions.clipped_relative_position_index(jnp.arange(4), jnp.arange(4), 1)
  values = (jnp.swapaxes(inputs["value"], 1, 2)[:, :, None] + inputs["rel_value"][row][None, None]
           )  # [b, h, q, k, d]
  np.testing.assert_allclose(out, jnp.einsum("bhqk,bhqkd->bqhd", kept, values), **TOL)
  no_rng = kernel.relative_dot_product_attention(**inputs, max_distance=1, dropout_rate=0.5)
  np.testing.assert_allclose(no_rng,
                             kernel.relative_dot_product_attention(**inputs, max_distance=1), **TOL)


def test_no_query_key_depth_tensor_is_built():
  # Distinct sizes: batch 2, q 5, kv 7, heads 3, depth 11, 2k+1 = 5.
  inputs = _random_inputs(10, 2, 5, 7, 3, 11, 2, False, "key+value")

  def loss(args):
    return jnp.sum(
        kernel.relative_dot_product_attention(
            **args, max_distance=2, query_positions=jnp.array([[0, 1, 2, 3, 4], [2, 3, 4, 5, 6]])))

  jaxpr = jax.make_jaxpr(jax.value_and_grad(loss))(inputs)
  shapes = []

  def collect(jaxpr):
    for eqn in jaxpr.eqns:
      shapes.extend(tuple(v.aval.shape) for v in eqn.outvars)
      for sub in jax_core.jaxprs_in_params(eqn.params):
        collect(sub)

  collect(jaxpr.jaxpr)
  assert (2, 3, 5, 7) in shapes  # the logits
  assert not any({5, 7, 11} <= set(s) for s in shapes)  # no [.., q, kv, .., depth] tensor


def test_invalid_arguments_raise():
  q = jnp.ones((1, 3, 2, 4))
  with pytest.raises(ValueError, match="rel_key"):
    kernel.relative_dot_product_attention(q, q, q, rel_key=jnp.ones((5, 4)), max_distance=1)
  with pytest.raises(ValueError, match="rel_value"):
    kernel.relative_dot_product_attention(q, q, q, rel_value=jnp.ones((3, 3, 4)), max_distance=1)
  with pytest.raises(ValueError, match="max_distance"):
    kernel.relative_dot_product_attention(q, q, q, max_distance=-1)
  with pytest.raises(ValueError, match="dropout_rate"):
    kernel.relative_dot_product_attention(q, q, q, dropout_rate=1.0)
  with pytest.raises(ValueError, match="query_positions"):
    kernel.relative_dot_product_attention(q, q, q, query_positions=jnp.arange(4))


@pytest.mark.parametrize(
    "name, shape",
    [
        ("mask", (2, 3, 3)),  # [batch, q, k]: would be read as [heads, q, k]
        ("mask", (3, 1, 3, 3)),  # batch 3 against 2: would grow the output's batch
        ("bias", (2, 2, 3, 4)),
    ])
def test_a_mask_or_bias_that_does_not_fit_the_logits_is_refused(name, shape):
  """Both are checked against [batch, heads, q_len, kv_len] = (2, 2, 3, 3), on every path."""
  q = jnp.ones((2, 3, 2, 4))
  value = jnp.ones(shape, bool if name == "mask" else jnp.float32)
  message = (f"{name} has shape {shape}; it must be [q_len, kv_len] or [batch or 1, heads or 1, "
             "q_len, kv_len] for [batch, heads, q_len, kv_len] = (2, 2, 3, 3).")
  calls = (lambda: kernel.relative_dot_product_attention(q, q, q, **{name: value}),
           lambda: kernel.relative_attention_weights(q, q, **{name: value}),
           lambda: fused.bias_attention(q, q, q, **{name: value}))
  for call in calls:
    with pytest.raises(ValueError, match=re.escape(message)):
      call()


def _bias_path_cases():
  """(name, attention kwargs) for the variants the bias path serves: a^K alone, T5, ALiBi, plain;
  causal and padded, sequential and packed positions."""
  positions_ = jnp.array([[0, 1, 2, 3, 0, 1, 2, 0], [0, 1, 2, 3, 4, 5, 0, 0]])
  segments = jnp.array([[1, 1, 1, 1, 2, 2, 2, 0], [1, 1, 1, 1, 1, 1, 0, 0]])
  packed = (segments[:, None, :, None] == segments[:, None, None, :])
  causal = packed & jnp.tril(jnp.ones((8, 8), bool))
  arange = jnp.arange(8)[None]
  return [
      ("rel_k", {"rel_key": _normal(20, (5, 8)), "max_distance": 2, "mask": causal}),
      ("rel_k_packed", {
          "rel_key": _normal(21, (2, 5, 8)), "max_distance": 2, "mask": packed,
          "query_positions": positions_, "key_positions": positions_
      }),
      ("t5", {"bias": _normal(22, (1, 2, 8, 8)), "mask": causal}),
      ("alibi",
       {"bias": positions.alibi_bias(arange, arange, positions.alibi_slopes(2)), "mask": packed}),
      ("plain", {"mask": packed}),
  ]


@pytest.mark.parametrize("name,kwargs", _bias_path_cases())
def test_bias_path_equals_the_xla_path(name, kwargs):
  inputs = _random_inputs(30, 2, 8, 8, 2, 8, 0, False, "")
  args = (inputs["query"], inputs["key"], inputs["value"])
  folded = fused.bias_attention(*args, **kwargs, implementation="xla")
  plain = kernel.relative_dot_product_attention(*args, **kwargs, implementation="xla")
  np.testing.assert_allclose(folded, plain, err_msg=name, **TOL)
  # In bfloat16 the folded bias is rounded to bfloat16 too (as cuDNN receives it).
  low = [x.astype(jnp.bfloat16) for x in args]
  folded = fused.bias_attention(*low, **kwargs, implementation="xla")
  assert folded.dtype == jnp.bfloat16
  # 0.007-0.019 measured over the cases, on outputs up to 3.0
  np.testing.assert_allclose(folded.astype(jnp.float32), plain, atol=0.04, err_msg=name)


def _cudnn_branch_on_cpu(monkeypatch) -> list[str]:
  """Sends `relative_dot_product_attention` down its cuDNN branch on CPU: `_use_cudnn` says yes
  and `jax.nn.dot_product_attention` runs as XLA. Returns the implementations it was asked for."""
  monkeypatch.setattr(kernel, "_use_cudnn", lambda *args: True)
  asked, dot_product_attention = [], jax.nn.dot_product_attention

  def as_xla(*args, implementation=None, **kwargs):
    asked.append(implementation)
    return dot_product_attention(*args, **kwargs, implementation="xla")

  monkeypatch.setattr(jax.nn, "dot_product_attention", as_xla)
  return asked


def _cudnn_branch_cases():
  """The bias path's cases, a k beyond the length (the tables' middle rows only) and a batch with
  padding queries that attend nowhere (opened by `distances.without_empty_rows` on that branch)."""
  real = jnp.array([[1, 1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1]], bool)
  padded = real[:, None, :, None] & real[:, None, None, :] & jnp.tril(jnp.ones((8, 8), bool))
  return _bias_path_cases() + [
      ("rel_k_k16", {"rel_key": _normal(23, (2, 33, 8)), "max_distance": 16}),
      ("rel_k_padded_rows", {"rel_key": _normal(24, (5, 8)), "max_distance": 2, "mask": padded}),
  ]


@pytest.mark.parametrize("name,kwargs", _cudnn_branch_cases())
def test_cudnn_branch_equals_the_xla_path_in_outputs_and_gradients(monkeypatch, name, kwargs):
  inputs = _random_inputs(34, 2, 8, 8, 2, 8, 0, False, "")
  args = (inputs["query"], inputs["key"], inputs["value"])
  mask = kwargs.get("mask")
  # Queries that attend somewhere: the others are padding, whose outputs nothing reads.
  attending = (jnp.ones(
      (2, 8), bool) if mask is None else jnp.broadcast_to(jnp.asarray(mask),
                                                          (2, 2, 8, 8)).any(-1).all(1)
              )  # [batch, q_len]

  def loss_and_grads(implementation):
    def loss(query, key, value):
      out = kernel.relative_dot_product_attention(query, key, value, **kwargs,
                                                  implementation=implementation)
      weights = _normal(35, out.shape) * attending[:, :, None, None]
      return jnp.sum(out * weights), out

    (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(*args)
    return out * attending[:, :, None, None], grads

  xla_out, xla_grads = loss_and_grads("xla")
  asked = _cudnn_branch_on_cpu(monkeypatch)
  cudnn_out, cudnn_grads = loss_and_grads("cudnn")
  assert asked and set(asked) == {"cudnn"}, name  # the branch ran
  np.testing.assert_allclose(cudnn_out, xla_out, err_msg=name, **TOL)
  for cudnn_grad, xla_grad in zip(cudnn_grads, xla_grads):
    assert np.isfinite(cudnn_grad).all(), name
    np.testing.assert_allclose(cudnn_grad, xla_grad, err_msg=name, **TOL)


def test_auto_is_xla_where_cudnn_cannot_run():
  inputs = _random_inputs(31, 2, 8, 8, 2, 8, 2, False, "key+value")
  auto = kernel.relative_dot_product_attention(**inputs, max_distance=2)
  xla = kernel.relative_dot_product_attention(**inputs, max_distance=2, implementation="xla")
  np.testing.assert_array_equal(auto, xla)


def test_auto_takes_cudnn_exactly_where_it_can_run(monkeypatch):
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")  # as a GPU would see the call
  half = jnp.zeros((1, 8, 2, 8), jnp.bfloat16)
  table = jnp.zeros((5, 8), jnp.bfloat16)
  assert kernel._use_cudnn("auto", half, half, half, None, False)
  assert not kernel._use_cudnn("auto", half, half, half, table, False)  # a^V
  assert not kernel._use_cudnn("auto", half, half, half, None, True)  # dropout
  full = half.astype(jnp.float32)
  assert not kernel._use_cudnn("auto", full, full, full, None, False)
  assert not kernel._use_cudnn("xla", half, half, half, None, False)


@pytest.mark.parametrize(
    "dtype,terms,dropout,depth,length,reason",
    [
        (jnp.bfloat16, "", False, 8, 8, "needs a GPU"),  # this CPU
        (jnp.float32, "", False, 8, 8, "float16 or bfloat16"),
        (jnp.bfloat16, "value", False, 8, 8, "a^V"),
        (jnp.bfloat16, "", True, 8, 8, "dropout"),
        (jnp.bfloat16, "", False, 12, 8, "multiple of 8"),
        (jnp.bfloat16, "", False, 8, 7, "even lengths"),
    ])
def test_cudnn_says_why_it_cannot_run(monkeypatch, dtype, terms, dropout, depth, length, reason):
  if reason != "needs a GPU":  # the other reasons, as a GPU would see them
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  inputs = _random_inputs(32, 1, length, length, 2, depth, 1, False, terms)
  query, key, value = (inputs[name].astype(dtype) for name in ("query", "key", "value"))
  found = fused.cudnn_unsupported(query, key, value, rel_value=inputs["rel_value"], dropout=dropout)
  assert reason in found
  with pytest.raises(ValueError, match=f"'cudnn' cannot run here: .*{re.escape(reason)}"):
    kernel.relative_dot_product_attention(query, key, value, rel_value=inputs["rel_value"],
                                          max_distance=1, dropout_rate=0.1 if dropout else 0.0,
                                          dropout_rng=jax.random.key(0) if dropout else None,
                                          implementation="cudnn")


def test_cudnn_accepts_a_half_precision_decode_step(monkeypatch):
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  query = jnp.zeros((2, 1, 2, 8), jnp.bfloat16)
  key = jnp.zeros((2, 10, 2, 8), jnp.bfloat16)
  assert fused.cudnn_unsupported(query, key, key) is None


def test_unknown_implementation_raises():
  inputs = _random_inputs(33, 1, 4, 4, 2, 4, 0, False, "")
  with pytest.raises(ValueError, match="implementation must be one of"):
    kernel.relative_dot_product_attention(inputs["query"], inputs["key"], inputs["value"],
                                          implementation="flash")


def test_without_empty_rows_opens_only_rows_that_attend_nowhere():
  mask = jnp.array([[True, False, False], [False, False, False], [False, True, True]])
  opened = distances.without_empty_rows(mask[None, None])[0, 0]
  np.testing.assert_array_equal(opened,
                                [[True, False, False], [True, True, True], [False, True, True]])
