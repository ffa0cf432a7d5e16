"""Examples -> batches: the training stream (shuffled every epoch, optionally concatenated),
its packed or length-bucketed batches, padded evaluation rows, and a host's rows of a batch.

Examples are {"inputs": [n] int32, "targets": [m] int32} token ids ending in EOS. Batches are
dicts of int32 numpy arrays [rows, length] with the keys of BATCH_KEYS: "inputs", "targets"
(token ids, PAD_ID padded), "inputs_position", "targets_position" (0-based, restarting per
packed segment, 0 on padding), "inputs_segmentation", "targets_segmentation" (segment id 1,
2, ... per packed example, 0 on padding). `relpos.data.pipeline.Task` makes them from a task's
tokenized splits.
"""

from collections.abc import Sequence

import grain
import numpy as np

from relpos.data import packing
from relpos.data import tokenizer as tokenizer_lib

BATCH_KEYS = ("inputs", "targets", "inputs_position", "targets_position", "inputs_segmentation",
              "targets_segmentation")
FEATURES = packing.FEATURES
# Unpacked batches are padded to a multiple of this length (few shapes to compile).
LENGTH_MULTIPLE = 16
# Length bucketing sorts windows of this many batches by length before batching.
BUCKET_WINDOW_BATCHES = 16

_NO_PREFETCH = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)


def _bucket_length(length: int) -> int:
  """The smallest multiple of LENGTH_MULTIPLE that is at least `length`."""
  return -(-length // LENGTH_MULTIPLE) * LENGTH_MULTIPLE


def shard_rows(batch: dict[str, np.ndarray], shard_index: int,
               shard_count: int) -> dict[str, np.ndarray]:
  """Host `shard_index`'s contiguous block of the rows of a global batch: the rows its devices
  hold in the global array, so that every process count assembles the same global batch (and
  each row keeps its dropout mask)."""
  return {k: np.split(np.asarray(v), shard_count)[shard_index] for k, v in batch.items()}


def pad_rows(rows: Sequence[dict[str, np.ndarray]], num_rows: int,
             max_length: int | None = None) -> dict[str, np.ndarray]:
  """Unpacked batch [num_rows, L] of `rows` (then all-padding rows); L = the longest side
  rounded up to a multiple of LENGTH_MULTIPLE, at most `max_length` when the rows fit it."""
  longest = max(len(r[k]) for r in rows for k in FEATURES)
  length = _bucket_length(longest)
  if max_length and longest <= max_length:
    length = min(length, max_length)
  batch = {k: np.zeros((num_rows, length), np.int32) for k in BATCH_KEYS}
  for i, row in enumerate(rows):
    for key in FEATURES:
      n = len(row[key])
      batch[key][i, :n] = row[key]
      batch[f"{key}_position"][i, :n] = np.arange(n)
      batch[f"{key}_segmentation"][i, :n] = 1
  return batch


def _shuffled_stream(examples: grain.MapDataset, seed: int, concat_probability: float = 0.0,
                     max_length: int = 0) -> grain.MapDataset:
  """Endless stream of the examples, in a new seeded order every epoch; with
  concat_probability > 0, some joined with another (`concatenated`)."""
  stream = examples.seed(seed).shuffle().repeat()
  if concat_probability > 0.0:
    stream = concatenated(stream, examples, concat_probability, max_length, seed)
  return stream


def join_pair(first: dict[str, np.ndarray], second: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """One training pair of two: each side the first's tokens without its final EOS, then the
  second's (int32 [n1 - 1 + n2])."""
  def without_eos(ids: np.ndarray) -> np.ndarray:
    return ids[:-1] if len(ids) and ids[-1] == tokenizer_lib.EOS_ID else ids

  return {k: np.concatenate([without_eos(first[k]), second[k]]).astype(np.int32) for k in FEATURES}


def concatenated(stream: grain.MapDataset, examples: grain.MapDataset, probability: float,
                 max_length: int, seed: int) -> grain.MapDataset:
  """Sentence concatenation (Kondo et al. 2021; Varis and Bojar 2021, "Sequence Length is a
  Domain"): element i of `stream` is, with `probability`, joined (`join_pair`) with an example
  of `examples` drawn uniformly, unless a side of the pair would exceed max_length tokens (then
  it stays alone). Each element's draw comes from (seed, i) alone, so the stream stays a
  MapDataset: checkpointed and resumed by its index like the plain one."""
  def maybe_join(index: int, example: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([seed, index, 0x636F6E63])  # "conc": not the shuffle's stream
    if rng.random() >= probability:
      return example
    joined = join_pair(example, examples[int(rng.integers(len(examples)))])
    return example if max(len(ids) for ids in joined.values()) > max_length else joined

  return stream.map_with_index(maybe_join)


def packed_batches(examples: grain.MapDataset, rows: int, length: int, seed: int,
                   concat_probability: float = 0.0) -> grain.IterDataset:
  """First-fit packing into `rows` bins of `length` tokens per side; one batch per window
  (an example that fits in no bin closes the batch and starts the next)."""
  stream = _shuffled_stream(examples, seed, concat_probability, length)
  return packing.FirstFitPackedBatches(stream.to_iter_dataset(_NO_PREFETCH), rows=rows,
                                       length=length, seed=seed)


class _Flatten(grain.experimental.FlatMapTransform):
  """A window's list of batches -> the batches, one element each."""

  max_fan_out = BUCKET_WINDOW_BATCHES

  def flat_map(self, element: list) -> list:
    return element


def bucketed_batches(examples: grain.MapDataset, batch_size: int, max_length: int, seed: int,
                     shard_index: int, shard_count: int,
                     concat_probability: float = 0.0) -> grain.IterDataset:
  """Length-bucketed global batches (the same on every host), this host's rows of each."""
  def sort_window(index: int, window: list[dict[str, np.ndarray]]) -> list[list]:
    order = sorted(range(len(window)), key=lambda i: max(len(window[i][k]) for k in FEATURES))
    batches = [[window[i]
                for i in order[start:start + batch_size]]
               for start in range(0, len(order), batch_size)]
    permutation = np.random.default_rng([seed, index]).permutation(len(batches))
    return [batches[i] for i in permutation]

  def host_rows(rows: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return shard_rows(pad_rows(rows, batch_size, max_length), shard_index, shard_count)

  windows = (_shuffled_stream(examples, seed, concat_probability,
                              max_length).batch(BUCKET_WINDOW_BATCHES * batch_size,
                                                batch_fn=list).map_with_index(sort_window))
  return grain.experimental.FlatMapIterDataset(windows.to_iter_dataset(_NO_PREFETCH),
                                               _Flatten()).map(host_rows)
