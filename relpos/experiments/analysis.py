"""What the position parameters learned: statistics from a checkpoint, and their plots.

`position_statistics` runs a restored model's encoder on source sentences and measures, per
encoder layer (self-attention, averaged over heads, sentences and query tokens):

- "attention_by_offset": mean attention weight a query puts on the key at offset j - i,
  for offsets -MAX_OFFSET..MAX_OFFSET (only pairs inside the sentence count);
- "qak_by_offset" (position 'relative' with a^K): mean of q_i · a^K[d] / sqrt(depth) for each
  clipped offset d = -k..k, the logit a^K adds at that offset;
- "t5_bias" (position 't5'): the encoder's learned bias [buckets][heads].

The runner stores these in each run's result.json, so `plot_learned_positions` draws from
results.json alone.
"""

import os
from typing import Any

import jax.numpy as jnp
import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

from relpos import model as model_lib
from relpos.data import tokenizer as tokenizer_lib
from relpos.experiments import report

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


def position_statistics(model: model_lib.Transformer, inputs: np.ndarray) -> dict[str, Any]:
  """Encoder position statistics (see the module docstring) on a batch of sources.

  Args:
    model: a restored Transformer.
    inputs: int32 [batch, n] source tokens, PAD_ID padded, one sentence a row.

  Returns:
    {"attention_by_offset": [layer][2*MAX_OFFSET+1] (None where no pair exists),
     "offsets": list of offsets, plus "qak_by_offset" [layer][2k+1] and "max_distance"
     for a^K, "t5_bias" [buckets][heads] for t5}.
  """
  encoder = model.encoder
  valid = inputs != tokenizer_lib.PAD_ID
  positions = jnp.arange(inputs.shape[1], dtype=jnp.int32)[None]
  mask = jnp.asarray(valid[:, None, :, None] & valid[:, None, None, :])
  x = encoder.embed_tokens(jnp.asarray(inputs), positions, True)
  stats: dict[str, Any] = {"offsets": list(range(-MAX_OFFSET, MAX_OFFSET + 1)),
                           "attention_by_offset": []}
  for layer in encoder.layers:
    attention = layer.self_attention
    sublayer_input = layer.attention_residual.sublayer_input(x)
    weights = attention.attention_weights(sublayer_input, mask=mask, query_positions=positions)
    stats["attention_by_offset"].append(_mean_by_offset(np.asarray(weights), valid))
    tables = attention.relative_tables
    if tables is not None and tables.rel_key is not None:
      query = attention.query(sublayer_input)  # [batch, n, heads, depth]
      table = tables.rel_key[...]
      spec = "bnhd,rd->bnhr" if table.ndim == 2 else "bnhd,hrd->bnhr"
      logits = np.asarray(jnp.einsum(spec, query, table)) * attention.head_dim ** -0.5
      stats.setdefault("qak_by_offset", []).append(
          (logits * valid[:, :, None, None]).sum((0, 1, 2)) / (valid.sum() * logits.shape[2]))
      stats["max_distance"] = tables.max_distance
    x = layer(x, mask=mask, positions=positions, deterministic=True)
  if "qak_by_offset" in stats:
    stats["qak_by_offset"] = [row.tolist() for row in stats["qak_by_offset"]]
  t5_bias = encoder.layers[0].self_attention.t5_bias
  if t5_bias is not None:
    stats["t5_bias"] = np.asarray(t5_bias.embedding[...]).tolist()
  return stats


def _first_with(runs: list[dict], key: str) -> dict[str, dict]:
  """Row -> position statistics of the lowest seed that has `key`, ablation rows first."""
  found: dict[str, dict] = {}
  for run in sorted(runs, key=lambda r: (r["table"] != "ablation", r["seed"])):
    stats = run.get("position_statistics", {})
    if key in stats and run["row"] not in found:
      found[run["row"]] = stats
  return found


def _per_layer_figure(by_row: dict[str, dict], key: str, x_of, title: str, ylabel: str,
                      path: str) -> str:
  """One subplot per encoder layer, one line per row, of stats[key][layer]."""
  num_layers = max(len(s[key]) for s in by_row.values())
  fig, axes = plt.subplots(1, num_layers, figsize=(4.5 * num_layers, 3.6), squeeze=False)
  for layer, ax in enumerate(axes[0]):
    for row, stats in by_row.items():
      if layer < len(stats[key]):
        points = [(x, y) for x, y in zip(x_of(stats), stats[key][layer]) if y is not None]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker=".", label=row)
    ax.set_title(f"{title}, encoder layer {layer}", fontsize=9)
    ax.set_xlabel("offset j - i")
    ax.set_ylabel(ylabel)
  axes[0][0].legend(fontsize=7, ncol=2)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


def plot_learned_positions(results_path: str, output_dir: str) -> list[str]:
  """attention_by_offset.png, qak_by_offset.png and t5_bias.png, where the runs support them."""
  runs = report.load_runs(results_path)
  made = []
  attention = _first_with(runs, "attention_by_offset")
  if attention:
    made.append(_per_layer_figure(
        attention, "attention_by_offset", lambda s: s["offsets"], "mean attention weight",
        "weight", os.path.join(output_dir, "attention_by_offset.png")))
  qak = _first_with(runs, "qak_by_offset")
  if qak:
    made.append(_per_layer_figure(
        qak, "qak_by_offset", lambda s: range(-s["max_distance"], s["max_distance"] + 1),
        "mean q·a^K / sqrt(d)", "logit", os.path.join(output_dir, "qak_by_offset.png")))
  t5 = _first_with(runs, "t5_bias")
  if t5:
    row, stats = next(iter(t5.items()))
    bias = np.asarray(stats["t5_bias"])  # [buckets, heads]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for head in range(bias.shape[1]):
      ax.plot(range(bias.shape[0]), bias[:, head], marker=".", label=f"head {head}")
    ax.set_title(f"T5 bias per bucket ({row}, encoder)", fontsize=9)
    half = bias.shape[0] // 2
    ax.set_xlabel(f"bucket (0-{half - 1}: key at or before the query, {half}-: after it)")
    ax.set_ylabel("bias")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(output_dir, "t5_bias.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    made.append(path)
  return made
