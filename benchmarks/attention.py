"""One self-attention layer, forward plus backward, for every position variant.

Each benchmark variant is a decoder self-attention layer as the model builds it: the position
variant from the registry (`relpos.variants.get`) with a model config, its `AttentionPosition`,
in `relpos.attention.MultiHeadAttention` (projections, the variant's queries and keys and
terms, the kernel). `loss = sum(out * cotangent)` is differentiated with respect to the layer's
input and every parameter (projections, relative tables, T5 bucket embedding), compiled once
per shape. For each sequence length the variants are timed interleaved in one process; XLA's
temporary memory and FLOPs come from the compiled program, so they are reported even where a
variant is too slow or too large to run (the naive form at long lengths).

Variants (heads and depth fixed, model dim heads * depth, causal mask as in decoder
self-attention; `POSITIONS` gives each one's `model.position` and fields):
  plain          no position term ('none'; absolute encodings act on the embeddings)
  rel_k, rel_v, rel_kv   Shaw et al. efficient form ('relative'), positions 0..n-1
  rel_kv_packed  rel_kv with per-row positions of packed segments and a segment mask: the
                 run-time checked path that training batches take
  t5, alibi      additive bias (T5 learned buckets, ALiBi slopes)
  rope           rotated queries and keys
  naive          the rel_kv layer (its projections and tables) with attention in the
                 materialized Shaw form as tensor2tensor builds it: per-pair tables
                 [q_len, kv_len, depth] shared across batch and heads
"""
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from benchmarks import common
from relpos import attention as attention_lib
from relpos import model as model_lib
from relpos import model_config as model_config_lib
from relpos import positions
from relpos import variants
from relpos.kernels import fused

LENGTHS = (64, 128, 256, 512, 1024, 2048)
QUICK_LENGTHS = (64, 256, 1024)
MAX_DISTANCES = (16, 64)
HEADS = 8
DEPTH = 64
TOKENS = 2048  # batch = TOKENS // n, between 1 and MAX_BATCH
MAX_BATCH = 8
NAIVE_MAX_TABLE_BYTES = 512 * 2**20  # one [n, n, depth] per-pair table, else compile only
T5_BUCKETS, T5_MAX_DISTANCE = 32, 128
RELATIVE = ("rel_k", "rel_v", "rel_kv", "rel_kv_packed", "naive")
FIXED = ("plain", "t5", "alibi", "rope")
# Benchmark variant -> (model.position, its fields); k is model.max_relative_position.
POSITIONS = {
    "plain": ("none", {}),
    "rel_k": ("relative", {"relative_value": False}),
    "rel_v": ("relative", {"relative_key": False}),
    "rel_kv": ("relative", {}),
    "rel_kv_packed": ("relative", {}),
    "naive": ("relative", {}),
    "t5": ("t5", {"t5_num_buckets": T5_BUCKETS, "t5_max_distance": T5_MAX_DISTANCE}),
    "alibi": ("alibi", {}),
    "rope": ("rope", {}),
}


def batch_size(length: int) -> int:
  """Rows per call at sequence length `length` (about TOKENS tokens, capped)."""
  return int(min(MAX_BATCH, max(1, TOKENS // length)))


def _normal(key: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.Array:
  return jax.random.normal(key, shape, jnp.float32).astype(dtype)


def packed_layout(batch: int, length: int) -> tuple[np.ndarray, np.ndarray]:
  """Positions and segment ids [batch, length] of rows packing 3 segments and padding.

  Segments take about 40%, 35% and 20% of a row; the last 5% is padding (position 0,
  segment 0), as in the packed training batches.
  """
  bounds = [0, int(0.4 * length), int(0.75 * length), int(0.95 * length)]
  positions_row = np.zeros(length, np.int32)
  segments_row = np.zeros(length, np.int32)
  for segment, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:]), start=1):
    positions_row[start:stop] = np.arange(stop - start)
    segments_row[start:stop] = segment
  return np.tile(positions_row, (batch, 1)), np.tile(segments_row, (batch, 1))


def layer_config(variant: str, max_distance: int, dtype: Any) -> model_config_lib.TransformerConfig:
  """The model config of a benchmark variant: HEADS heads of depth DEPTH, no dropout."""
  position, fields = POSITIONS[variant]
  values = {
      **model_config_lib.default_config().to_dict(), "position": position, "num_heads": HEADS,
      "qkv_dim": HEADS * DEPTH, "emb_dim": HEADS * DEPTH, "attention_dropout_rate": 0.0,
      "dtype": jnp.dtype(dtype).name, "max_relative_position": max_distance, **fields
  }
  return model_config_lib.TransformerConfig.from_config(values, vocab_size=2)


def build_layer(variant: str, max_distance: int, dtype: Any = jnp.float32,
                seed: int = 0) -> attention_lib.MultiHeadAttention:
  """A decoder self-attention layer of `variant`, built by its registered position variant."""
  config = layer_config(variant, max_distance, dtype)
  rngs = nnx.Rngs(params=seed)
  position = variants.get(config.position)(config).self_attention(1, causal=True, rngs=rngs)[0]
  return model_lib._attention(config, position, rngs=rngs)  # pylint: disable=protected-access


def _projected(layer: attention_lib.MultiHeadAttention, inputs: jax.Array, mask: jax.Array,
               attend: Callable[..., jax.Array]) -> jax.Array:
  """layer.out(attend(query, key, value, terms, mask, positions)): the layer's projections
  (queries and keys transformed by its position module) around another attention function.

  Args:
    inputs: [batch, n, model_dim], at positions 0..n-1.
    attend: (query, key, value [batch, n, heads, depth], terms (`AttentionTerms`), mask,
      positions [1, n]) -> [batch, n, heads, depth].
  """
  arange = jnp.arange(inputs.shape[1], dtype=jnp.int32)[None]
  query, key, value = layer.query(inputs), layer.key(inputs), layer.value(inputs)
  terms = variants.AttentionTerms()
  if layer.position is not None:
    query, key = layer.position.queries_and_keys(query, key, arange, arange)
    terms = layer.position.terms(arange, arange)
  return layer.out(attend(query, key, value, terms, mask, arange))


def _naive_attention(query, key, value, terms, mask, arange):
  """Shaw et al. eqs. 3-5 with per-pair tables [q_len, kv_len, depth] (tensor2tensor style)."""
  index = positions.clipped_relative_position_index(arange[0], arange[0], terms.max_distance)
  query = query * query.shape[-1]**-0.5
  logits = jnp.einsum("bqhd,bkhd->bhqk", query, key)  # [b, h, q, k]
  if terms.rel_key is not None:
    logits += jnp.einsum("bqhd,qkd->bhqk", query, terms.rel_key[index])  # [b, h, q, k]
  weights = jax.nn.softmax(jnp.where(mask, logits, jnp.finfo(jnp.float32).min), axis=-1)
  out = jnp.einsum("bhqk,bkhd->bqhd", weights, value)  # [b, q, h, d]
  if terms.rel_value is not None:
    out += jnp.einsum("bhqk,qkd->bqhd", weights, terms.rel_value[index])  # [b, q, h, d]
  return out


def _dot_product_attention(query, key, value, terms, mask, arange):
  """`jax.nn.dot_product_attention` (the call a GPU makes), a^K folded into its bias."""
  return fused.bias_attention(query, key, value, rel_key=terms.rel_key,
                              max_distance=terms.max_distance, bias=terms.bias, mask=mask,
                              query_positions=arange, key_positions=arange, implementation="xla")


def layer_output(variant: str, layer: attention_lib.MultiHeadAttention, inputs: jax.Array,
                 layout: dict[str, jax.Array]) -> jax.Array:
  """The output [batch, n, model_dim] of one variant's layer.

  Args:
    variant: a name of FIXED or RELATIVE.
    layer: its layer (`build_layer`).
    inputs: [batch, n, model_dim].
    layout: 'mask' bool [1, 1, n, n] (causal) and, for rel_kv_packed, 'packed_mask'
      [batch, 1, n, n] and 'positions' [batch, n].
  """
  if variant == "naive":
    return _projected(layer, inputs, layout["mask"], _naive_attention)
  if variant == "rel_kv_packed":
    return layer(inputs, mask=layout["packed_mask"], query_positions=layout["positions"])
  return layer(inputs, mask=layout["mask"])


def make_arguments(
    variant: str, batch: int, length: int, max_distance: int, dtype: Any = jnp.float32,
    seed: int = 0
) -> tuple[attention_lib.MultiHeadAttention, tuple[jax.Array, jax.Array], dict[str, jax.Array]]:
  """(the layer, (inputs, cotangent) [batch, n, model_dim], layout) for one shape."""
  keys = jax.random.split(jax.random.key(seed), 2)
  tensors = tuple(_normal(k, (batch, length, HEADS * DEPTH), dtype) for k in keys)
  causal = jnp.tril(jnp.ones((length, length), bool))
  positions_, segments = packed_layout(batch, length)
  segments = jnp.asarray(segments)
  packed_mask = (segments[:, :, None] == segments[:, None, :]) & causal
  layout = {
      "mask": causal[None, None], "packed_mask": packed_mask[:, None],
      "positions": jnp.asarray(positions_)
  }
  return build_layer(variant, max_distance, dtype, seed), tensors, layout


def fwd_bwd(variant: str, graphdef: nnx.GraphDef) -> Callable[..., Any]:
  """jit((layer state, inputs, cotangent, layout) -> gradients) of one variant's layer."""
  def loss(state, inputs, cotangent, layout):
    out = layer_output(variant, nnx.merge(graphdef, state), inputs, layout)
    return jnp.sum(out.astype(jnp.float32) * cotangent.astype(jnp.float32))

  return jax.jit(jax.grad(loss, argnums=(0, 1)))


def check_variants(length: int = 12, max_distance: int = 3) -> dict[str, float]:
  """Largest |difference| of each variant's layer output from a reference, at a tiny size.

  The references take the layer's own projections and position terms: rel_* against the naive
  form (rel_kv_packed against the naive form run per segment), and the variants without a^V
  against `jax.nn.dot_product_attention` (the call a GPU makes), with a^K folded into its bias
  for rel_k.
  """
  out, layers = {}, {}
  for variant in FIXED + RELATIVE:
    layers[variant], (inputs, _), layout = make_arguments(variant, 2, length, max_distance)
    out[variant] = layer_output(variant, layers[variant], inputs, layout)
  mask = layout["mask"]
  result = {
      name: float(
          jnp.max(jnp.abs(out[name] - _projected(layers[name], inputs, mask, _naive_attention)))
      ) for name in ("rel_kv", "rel_k", "rel_v")
  }
  _, segments = packed_layout(2, length)
  packed_reference = jnp.zeros_like(out["rel_kv_packed"])
  for segment in range(1, int(segments.max()) + 1):
    columns = np.flatnonzero(segments[0] == segment)
    part = slice(int(columns[0]), int(columns[-1]) + 1)
    alone = _projected(layers["rel_kv_packed"], inputs[:, part], mask[..., part, part],
                       _naive_attention)
    packed_reference = packed_reference.at[:, part].set(alone)
  real = jnp.asarray(segments > 0)[:, :, None]
  result["rel_kv_packed"] = float(
      jnp.max(jnp.abs(jnp.where(real, out["rel_kv_packed"] - packed_reference, 0.0))))
  for name in FIXED + ("rel_k",):
    reference = _projected(layers[name], inputs, mask, _dot_product_attention)
    key = "rel_k_folded_into_bias" if name == "rel_k" else f"{name}_vs_dot_product_attention"
    result[key] = float(jnp.max(jnp.abs(out[name] - reference)))
  return result


def _record(variant: str, length: int, batch: int, max_distance: int | None,
            stats: dict[str, Any]) -> dict[str, Any]:
  return {
      "variant": variant, "n": length, "batch": batch, "heads": HEADS, "depth": DEPTH,
      "k": max_distance, **stats
  }


def _naive_fits(length: int) -> bool:
  return length * length * DEPTH * 4 <= NAIVE_MAX_TABLE_BYTES


def run(*, quick: bool = False, rounds: int | None = None) -> dict[str, Any]:
  """Runs the attention benchmark.

  Args:
    quick: fewer lengths and rounds.
    rounds: timed rounds per length (default: 5, 3 from n = 1024, 2 at 2048; quick 3).

  Returns:
    {'records': [...], 'check': max errors of `check_variants`, 'notes': [...], 'dtype',
    'heads', 'depth', 'model_dim'}, one record per (n, variant, k) with seconds, temp_bytes
    and flops and their ratios to plain.
  """
  dtype = jnp.bfloat16 if jax.default_backend() == "gpu" else jnp.float32
  records, notes = [], []
  check = check_variants()
  common.progress(f"attention: variants match their references (max error "
                  f"{max(check.values()):.1e})")
  for length in (QUICK_LENGTHS if quick else LENGTHS):
    batch = batch_size(length)
    plan = [(v, None) for v in FIXED] + [(v, k) for k in MAX_DISTANCES for v in RELATIVE]
    calls, stats = {}, {}
    for variant, max_distance in plan:
      layer, tensors, layout = make_arguments(variant, batch, length, max_distance or 0, dtype)
      graphdef, state = nnx.split(layer)
      compiled = fwd_bwd(variant, graphdef).lower(state, *tensors, layout).compile()
      name = f"{variant}/k={max_distance}"
      stats[name] = common.compiled_stats(compiled)
      if variant == "naive" and not _naive_fits(length):
        notes.append(f"naive at n={length}, k={max_distance}: compiled only (per-pair tables "
                     f"of {length * length * DEPTH * 4 / 2 ** 20:.0f} MiB each), not timed.")
        continue
      calls[name] = functools.partial(compiled, state, *tensors, layout)
    default_rounds = 3 if quick else (5 if length < 1024 else 3 if length < 2048 else 2)
    common.progress(f"attention n={length} batch={batch}: timing {len(calls)} programs")
    seconds = common.interleaved_medians(calls, rounds=rounds or default_rounds)
    base = stats["plain/k=None"]
    for variant, max_distance in plan:
      name = f"{variant}/k={max_distance}"
      entry = dict(stats[name], seconds=seconds.get(name))
      entry["time_ratio"] = (None if entry["seconds"] is None else entry["seconds"] /
                             seconds["plain/k=None"])
      entry["temp_ratio"] = _ratio(entry["temp_bytes"], base["temp_bytes"])
      entry["flops_ratio"] = _ratio(entry["flops"], base["flops"])
      records.append(_record(variant, length, batch, max_distance, entry))
  return {
      "records": records, "check": check, "notes": notes, "dtype": jnp.dtype(dtype).name,
      "heads": HEADS, "depth": DEPTH, "model_dim": HEADS * DEPTH
  }


def _ratio(value: float | None, base: float | None) -> float | None:
  if value is None or not base:
    return None
  return value / base


def temp_growth(records: list[dict[str, Any]], variant: str = "rel_kv") -> dict[str, Any]:
  """How `variant`'s extra temporary memory over plain grows with n and k.

  Returns extra bytes per (n, k) and, per k, the exponent p of extra ~ n^p fitted between the
  two longest lengths where `variant` needs more than plain (1 for O(n k) growth, 2 for O(n^2)
  growth), and those two lengths.
  """
  plain = {r["n"]: r["temp_bytes"] for r in records if r["variant"] == "plain"}
  extra = {}
  for r in records:
    if r["variant"] == variant and r["temp_bytes"] is not None:
      extra[(r["n"], r["k"])] = (r["temp_bytes"] - plain[r["n"]], r["batch"])
  exponents, fitted_between = {}, {}
  for k in sorted({k for _, k in extra}):
    points = sorted((n, e / b) for (n, kk), (e, b) in extra.items() if kk == k and e > 0)
    if len(points) >= 2:
      (n0, e0), (n1, e1) = points[-2], points[-1]
      exponents[str(k)] = math.log(e1 / e0) / math.log(n1 / n0)
      fitted_between[str(k)] = (n0, n1)
  return {
      "extra_bytes": {f"n={n},k={k}": e for (n, k), (e, _) in sorted(extra.items())},
      "exponent_per_row": exponents, "fitted_between": fitted_between
  }
