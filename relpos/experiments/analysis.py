"""What the position parameters learned: statistics from a checkpoint, and their plots.

`position_statistics` runs a restored model's encoder on source sentences and measures, per
encoder layer (self-attention, averaged over heads, sentences and query tokens):

- "attention_by_offset": mean attention weight a query puts on the key at offset j - i,
  for offsets -MAX_OFFSET..MAX_OFFSET (only pairs inside the sentence count);
- "longest_distance": the largest |j - i| within one of the sentences (their longest length
  minus 1), the distances the plots show;
- what each layer's position module adds (`relpos.variants.AttentionPosition.add_statistics`):
  "qak_by_offset" [layer][2k+1] and "max_distance" k (relative, with a^K: the mean logit
  q_i · a^K[d] / sqrt(depth) a^K adds at each clipped offset d = -k..k), "t5_bias"
  [buckets][heads] (t5: the encoder's learned bias); the plots below draw these.

`attention_profile` measures, per encoder layer, how spread out each query's attention is
("entropy_by_query", in nats, by query position) and the offset profile above; the runner
computes it on short (test) and long (test_long) sources beside each other (docs/length.md).

The runner stores these in each run's result.json, so `plot_learned_positions` draws from
results.json alone.
"""
from collections.abc import Iterator

import os
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

from relpos import model as model_lib
from relpos import positions as positions_lib
from relpos.data import tokenizer as tokenizer_lib
from relpos.experiments import plots
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
  x = encoder.embed_tokens(jnp.asarray(inputs), positions, True)
  for layer in encoder.layers:
    attention = layer.self_attention
    sublayer_input = layer.attention_residual.sublayer_input(x)
    weights = attention.attention_weights(sublayer_input, mask=mask, query_positions=positions)
    yield attention, sublayer_input, np.asarray(weights)
    x = layer(x, mask=mask, positions=positions, deterministic=True)


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


def _first_with(runs: list[dict], key: str) -> dict[str, dict]:
  """Row -> the run of lowest seed whose position statistics have `key`, ablation rows first."""
  found: dict[str, dict] = {}
  for run in sorted(runs, key=lambda r: (r["table"] != "ablation", r["seed"])):
    if key in run.get("position_statistics", {}) and run["row"] not in found:
      found[run["row"]] = run
  return found


def reach(runs: Sequence[dict]) -> tuple[int, str]:
  """The longest distance |j - i| that occurs in the runs' analysed sentences, and where it
  comes from; for results that lack it, the longest a training sequence can hold.

  Returns:
    (distance, "the longest analysed sentence" | "task.max_length - 1").
  """
  stats = [run["position_statistics"] for run in runs]
  if all("longest_distance" in s for s in stats):
    return max(s["longest_distance"] for s in stats), "the longest analysed sentence"
  return (max(run["config"]["task"]["max_length"] for run in runs) - 1, "task.max_length - 1")


def _attention_curve(run: dict, layer: int) -> tuple[list[int], list[float]]:
  """(offsets, mean attention weights) of an encoder layer where some pair exists."""
  stats = run["position_statistics"]
  points = [
      (x, y) for x, y in zip(stats["offsets"], stats["attention_by_offset"][layer]) if y is not None
  ]
  return [x for x, _ in points], [y for _, y in points]


def _qak_curve(run: dict, layer: int, distance: int) -> tuple[np.ndarray, np.ndarray]:
  """(offsets d in ±distance, mean q·a^K[clip(d, -k, k)] / sqrt(depth)) of an encoder layer."""
  stats = run["position_statistics"]
  k = stats["max_distance"]
  offsets = np.arange(-distance, distance + 1)
  return offsets, np.asarray(stats["qak_by_offset"][layer])[np.clip(offsets, -k, k) + k]


def _per_layer_figure(by_row: dict[str, dict], key: str, curve, title: str, ylabel: str,
                      path: str) -> str:
  """One subplot per encoder layer, one line per row: curve(run, layer) -> (x, y)."""
  num_layers = max(len(run["position_statistics"][key]) for run in by_row.values())
  fig, axes = plt.subplots(1, num_layers, figsize=(4.5 * num_layers, 3.8), squeeze=False)
  for layer, ax in enumerate(axes[0]):
    for row, run in by_row.items():
      if layer < len(run["position_statistics"][key]):
        ax.plot(*curve(run, layer), marker=".", markersize=3, label=row)
    ax.set_title(f"encoder layer {layer}", fontsize=9)
    ax.set_xlabel("offset j - i (key minus query)")
    ax.set_ylabel(ylabel)
  axes[0][0].legend(fontsize=7, ncol=2)
  fig.suptitle(f"{title}\n{plots.describe(list(by_row.values()))}", fontsize=9)
  return plots.save(fig, path)


def _t5_bias_figure(row: str, run: dict, path: str) -> str:
  """The encoder's T5 bias of each head against the distance j - i it applies to."""
  config = run["config"]["model"]
  bias = np.asarray(run["position_statistics"]["t5_bias"])  # [buckets, heads]
  distance, source = reach([run])
  distances = np.arange(-distance, distance + 1)
  buckets = np.asarray(
      positions_lib.t5_relative_position_bucket(distances, bidirectional=True,
                                                num_buckets=config["t5_num_buckets"],
                                                max_distance=config["t5_max_distance"]))
  fig, ax = plt.subplots(figsize=(6.5, 3.8))
  for head in range(bias.shape[1]):
    ax.plot(distances, bias[buckets, head], drawstyle="steps-mid", label=f"head {head}")
  ax.set_xlabel("distance j - i (key minus query)")
  ax.set_ylabel("bias")
  ax.set_title(
      f"T5 bias of the encoder ({row}) by distance, up to {distance} ({source})\n"
      f"{plots.describe([run])}", fontsize=9)
  ax.legend(fontsize=7)
  return plots.save(fig, path)


def plot_learned_positions(results_path: str, output_dir: str) -> list[str]:
  """attention_by_offset.png, qak_by_offset.png and t5_bias.png, where the runs support them.

  Each draws the lowest seed of each row; a^K logits and T5 biases are drawn for the
  distances that occur (`reach`), not for the whole table.
  """
  runs = report.load_runs(results_path)
  made = []
  attention = _first_with(runs, "attention_by_offset")
  if attention:
    made.append(
        _per_layer_figure(attention, "attention_by_offset", _attention_curve,
                          "Mean attention weight by offset (encoder self-attention)", "weight",
                          os.path.join(output_dir, "attention_by_offset.png")))
  qak = _first_with(runs, "qak_by_offset")
  if qak:
    distance, source = reach(list(qak.values()))
    made.append(
        _per_layer_figure(
            qak, "qak_by_offset", lambda run, layer: _qak_curve(run, layer, distance),
            f"Mean logit q·a^K / sqrt(d) that a^K adds at each offset (clipped at k), up to "
            f"{distance} ({source})", "logit", os.path.join(output_dir, "qak_by_offset.png")))
  t5 = _first_with(runs, "t5_bias")
  if t5:
    row, run = next(iter(t5.items()))
    made.append(_t5_bias_figure(row, run, os.path.join(output_dir, "t5_bias.png")))
  return made
