"""Attention alone, forward plus backward, for every position variant.

Each variant is `loss = sum(out * cotangent)` differentiated with respect to query, key, value
and its own parameters (relative tables, T5 bucket embedding), compiled once per shape. For
each sequence length the variants are timed interleaved in one process; XLA's temporary memory
and FLOPs come from the compiled program, so they are reported even where a variant is too
slow or too large to run (the naive form at long lengths).

Variants (heads and depth fixed, causal mask as in decoder self-attention):
  plain          no position term (absolute / none)
  rel_k, rel_v, rel_kv   Shaw et al. efficient form, positions 0..n-1
  rel_kv_packed  rel_kv with per-row positions of packed segments and a segment mask: the
                 run-time checked path that training batches take
  t5, alibi      additive bias (T5 learned buckets, ALiBi slopes)
  rope           rotated queries and keys
  naive          the materialized Shaw form as tensor2tensor builds it: per-pair tables
                 [q_len, kv_len, depth] shared across batch and heads
"""
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from relpos import positions
from relpos.kernels import fused
from relpos.kernels import relative as kernel

LENGTHS = (64, 128, 256, 512, 1024, 2048)
QUICK_LENGTHS = (64, 256, 1024)
MAX_DISTANCES = (16, 64)
HEADS = 8
DEPTH = 64
TOKENS = 2048  # batch = TOKENS // n, between 1 and MAX_BATCH
MAX_BATCH = 8
NAIVE_MAX_TABLE_BYTES = 512 * 2 ** 20  # one [n, n, depth] per-pair table, else compile only
T5_BUCKETS, T5_MAX_DISTANCE = 32, 128
RELATIVE = ("rel_k", "rel_v", "rel_kv", "rel_kv_packed", "naive")
FIXED = ("plain", "t5", "alibi", "rope")


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


def _naive_attention(query, key, value, rel_key, rel_value, max_distance, mask):
  """Shaw et al. eqs. 3-5 with per-pair tables [q_len, kv_len, depth] (tensor2tensor style)."""
  q_len, kv_len, depth = query.shape[1], key.shape[1], query.shape[-1]
  index = positions.clipped_relative_position_index(jnp.arange(q_len), jnp.arange(kv_len),
                                                    max_distance)
  query = query * depth ** -0.5
  logits = (jnp.einsum("bqhd,bkhd->bhqk", query, key)
            + jnp.einsum("bqhd,qkd->bhqk", query, rel_key[index]))
  weights = jax.nn.softmax(jnp.where(mask, logits, jnp.finfo(jnp.float32).min), axis=-1)
  return (jnp.einsum("bhqk,bkhd->bqhd", weights, value)
          + jnp.einsum("bhqk,qkd->bqhd", weights, rel_value[index]))


def _t5_bias(embedding: jax.Array, length: int) -> jax.Array:
  """Causal T5 bias [1, heads, n, n] from a bucket embedding [buckets, heads]."""
  arange = jnp.arange(length)
  buckets = positions.t5_relative_position_bucket(
      positions.relative_positions(arange, arange), bidirectional=False,
      num_buckets=T5_BUCKETS, max_distance=T5_MAX_DISTANCE)
  return jnp.moveaxis(embedding[buckets], -1, 0)[None]


def variant_output(variant: str, max_distance: int, params: dict[str, jax.Array],
                   query: jax.Array, key: jax.Array, value: jax.Array,
                   layout: dict[str, jax.Array]) -> jax.Array:
  """The attention output [batch, n, heads, depth] of one variant.

  Args:
    variant: a name of FIXED or RELATIVE.
    max_distance: k (relative variants).
    params: 'rel_key', 'rel_value' [2k+1, depth] and 't5' [buckets, heads].
    query, key, value: [batch, n, heads, depth].
    layout: 'mask' bool [1, 1, n, n] (causal) and, for rel_kv_packed, 'packed_mask'
      [batch, 1, n, n] and 'positions' [batch, n].
  """
  mask = layout["mask"]
  call = functools.partial(kernel.relative_dot_product_attention, query, key, value)
  if variant == "plain":
    return call(mask=mask)
  if variant in ("rel_k", "rel_v", "rel_kv"):
    return call(rel_key=params["rel_key"] if variant != "rel_v" else None,
                rel_value=params["rel_value"] if variant != "rel_k" else None,
                max_distance=max_distance, mask=mask)
  if variant == "rel_kv_packed":
    return call(rel_key=params["rel_key"], rel_value=params["rel_value"],
                max_distance=max_distance, mask=layout["packed_mask"],
                query_positions=layout["positions"], key_positions=layout["positions"])
  if variant == "t5":
    return call(bias=_t5_bias(params["t5"], query.shape[1]), mask=mask)
  if variant == "alibi":
    arange = jnp.arange(query.shape[1])[None]
    return call(bias=positions.alibi_bias(arange, arange, positions.alibi_slopes(query.shape[2])),
                mask=mask)
  if variant == "rope":
    arange = jnp.arange(query.shape[1])[None]
    return kernel.relative_dot_product_attention(
        positions.apply_rope(query, arange), positions.apply_rope(key, arange), value, mask=mask)
  if variant == "naive":
    return _naive_attention(query, key, value, params["rel_key"], params["rel_value"],
                            max_distance, mask)
  raise ValueError(f"unknown attention variant {variant!r}; allowed: {FIXED + RELATIVE}.")


def make_arguments(batch: int, length: int, max_distance: int, dtype: Any = jnp.float32,
                   seed: int = 0) -> tuple[dict[str, jax.Array], tuple[jax.Array, ...],
                                           dict[str, jax.Array]]:
  """(params, (query, key, value, cotangent), layout) for one shape."""
  keys = jax.random.split(jax.random.key(seed), 7)
  shape = (batch, length, HEADS, DEPTH)
  table = (2 * max_distance + 1, DEPTH)
  params = {"rel_key": _normal(keys[0], table, dtype) * DEPTH ** -0.5,
            "rel_value": _normal(keys[1], table, dtype) * DEPTH ** -0.5,
            "t5": _normal(keys[2], (T5_BUCKETS, HEADS), jnp.float32)}
  tensors = tuple(_normal(k, shape, dtype) for k in keys[3:])
  causal = jnp.tril(jnp.ones((length, length), bool))
  positions_, segments = packed_layout(batch, length)
  segments = jnp.asarray(segments)
  packed_mask = (segments[:, :, None] == segments[:, None, :]) & causal
  layout = {"mask": causal[None, None], "packed_mask": packed_mask[:, None],
            "positions": jnp.asarray(positions_)}
  return params, tensors, layout


def fwd_bwd(variant: str, max_distance: int) -> Callable[..., Any]:
  """jit((params, query, key, value, cotangent, layout) -> gradients) of one variant."""

  def loss(params, query, key, value, cotangent, layout):
    out = variant_output(variant, max_distance, params, query, key, value, layout)
    return jnp.sum(out.astype(jnp.float32) * cotangent.astype(jnp.float32))

  return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))


def check_variants(length: int = 12, max_distance: int = 3) -> dict[str, float]:
  """Largest |difference| of each efficient variant's output from a reference, at a tiny size.

  rel_* against the naive form (rel_kv_packed against the naive form run per segment), and the
  additive-bias variants against `jax.nn.dot_product_attention` (the call a GPU makes), with
  a^K folded into its bias for rel_k.
  """
  params, (query, key, value, _), layout = make_arguments(2, length, max_distance)
  out = {v: variant_output(v, max_distance, params, query, key, value, layout)
         for v in FIXED + RELATIVE}
  naive = out["naive"]
  zero = {"rel_key": jnp.zeros_like(params["rel_key"]),
          "rel_value": jnp.zeros_like(params["rel_value"])}
  errors = {
      "rel_kv": naive,
      "rel_k": variant_output("naive", max_distance, {**params, "rel_value": zero["rel_value"]},
                              query, key, value, layout),
      "rel_v": variant_output("naive", max_distance, {**params, "rel_key": zero["rel_key"]},
                              query, key, value, layout),
  }
  positions_, segments = packed_layout(2, length)
  packed_reference = jnp.zeros_like(naive)
  for segment in range(1, int(segments.max()) + 1):
    columns = np.flatnonzero(segments[0] == segment)
    part = slice(int(columns[0]), int(columns[-1]) + 1)
    alone = _naive_attention(query[:, part], key[:, part], value[:, part], params["rel_key"],
                             params["rel_value"], max_distance,
                             layout["mask"][..., part, part])
    packed_reference = packed_reference.at[:, part].set(alone)
  real = jnp.asarray(segments > 0)[:, :, None, None]
  result = {name: float(jnp.max(jnp.abs(out[name] - ref))) for name, ref in errors.items()}
  result["rel_kv_packed"] = float(jnp.max(jnp.abs(
      jnp.where(real, out["rel_kv_packed"] - packed_reference, 0.0))))
  arange = jnp.arange(length)[None]
  biases = {"plain": None, "t5": _t5_bias(params["t5"], length),
            "alibi": positions.alibi_bias(arange, arange, positions.alibi_slopes(HEADS))}
  for name, bias in biases.items():
    reference = jax.nn.dot_product_attention(query, key, value, bias=bias, mask=layout["mask"],
                                             implementation="xla")
    result[f"{name}_vs_dot_product_attention"] = float(jnp.max(jnp.abs(out[name] - reference)))
  folded = fused.bias_attention(query, key, value, rel_key=params["rel_key"],
                                max_distance=max_distance, mask=layout["mask"],
                                implementation="xla")
  result["rel_k_folded_into_bias"] = float(jnp.max(jnp.abs(out["rel_k"] - folded)))
  return result


def _record(variant: str, length: int, batch: int, max_distance: int | None,
            stats: dict[str, Any]) -> dict[str, Any]:
  return {"variant": variant, "n": length, "batch": batch, "heads": HEADS, "depth": DEPTH,
          "k": max_distance, **stats}


def _naive_fits(length: int) -> bool:
  return length * length * DEPTH * 4 <= NAIVE_MAX_TABLE_BYTES


def run(*, quick: bool = False, rounds: int | None = None) -> dict[str, Any]:
  """Runs the attention benchmark.

  Args:
    quick: fewer lengths and rounds.
    rounds: timed rounds per length (default: 5, 3 from n = 1024, 2 at 2048; quick 3).

  Returns:
    {'records': [...], 'check': max errors of `check_variants`, 'notes': [...]}, one record
    per (n, variant, k) with seconds, temp_bytes and flops and their ratios to plain.
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
      params, tensors, layout = make_arguments(batch, length, max_distance or 0, dtype)
      compiled = fwd_bwd(variant, max_distance or 0).lower(params, *tensors, layout).compile()
      name = f"{variant}/k={max_distance}"
      stats[name] = common.compiled_stats(compiled)
      if variant == "naive" and not _naive_fits(length):
        notes.append(f"naive at n={length}, k={max_distance}: compiled only (per-pair tables "
                     f"of {length * length * DEPTH * 4 / 2 ** 20:.0f} MiB each), not timed.")
        continue
      calls[name] = functools.partial(compiled, params, *tensors, layout)
    default_rounds = 3 if quick else (5 if length < 1024 else 3 if length < 2048 else 2)
    common.progress(f"attention n={length} batch={batch}: timing {len(calls)} programs")
    seconds = common.interleaved_medians(calls, rounds=rounds or default_rounds)
    base = stats["plain/k=None"]
    for variant, max_distance in plan:
      name = f"{variant}/k={max_distance}"
      entry = dict(stats[name], seconds=seconds.get(name))
      entry["time_ratio"] = (None if entry["seconds"] is None
                             else entry["seconds"] / seconds["plain/k=None"])
      entry["temp_ratio"] = _ratio(entry["temp_bytes"], base["temp_bytes"])
      entry["flops_ratio"] = _ratio(entry["flops"], base["flops"])
      records.append(_record(variant, length, batch, max_distance, entry))
  return {"records": records, "check": check, "notes": notes, "dtype": jnp.dtype(dtype).name,
          "heads": HEADS, "depth": DEPTH}


def _ratio(value: float | None, base: float | None) -> float | None:
  if value is None or not base:
    return None
  return value / base


def temp_growth(records: list[dict[str, Any]], variant: str = "rel_kv") -> dict[str, Any]:
  """How `variant`'s extra temporary memory over plain grows with n and k.

  Returns extra bytes per (n, k) and, per k, the exponent p of extra ~ n^p fitted between the
  two longest lengths (1 for O(n k) growth, 2 for O(n^2) growth).
  """
  plain = {r["n"]: r["temp_bytes"] for r in records if r["variant"] == "plain"}
  extra = {}
  for r in records:
    if r["variant"] == variant and r["temp_bytes"] is not None:
      extra[(r["n"], r["k"])] = (r["temp_bytes"] - plain[r["n"]], r["batch"])
  exponents = {}
  for k in sorted({k for _, k in extra}):
    points = sorted((n, e / b) for (n, kk), (e, b) in extra.items() if kk == k and e > 0)
    if len(points) >= 2:
      (n0, e0), (n1, e1) = points[-2], points[-1]
      exponents[str(k)] = math.log(e1 / e0) / math.log(n1 / n0)
  return {"extra_bytes": {f"n={n},k={k}": e for (n, k), (e, _) in sorted(extra.items())},
          "exponent_per_row": exponents}
