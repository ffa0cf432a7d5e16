"""Tests for relpos.data.batching: padded rows, a host's rows, concatenation, bucketing (the
batches of a real task, packed and bucketed, resumed and sharded: test_data_pipeline.py)."""

import grain
import numpy as np

from relpos.data import batching
from relpos.data import tokenizer as tokenizer_lib

EOS = tokenizer_lib.EOS_ID


def _pair(num_inputs: int, num_targets: int, token: int = 7) -> dict[str, np.ndarray]:
  """An example with `num_inputs` and `num_targets` ids, each side ending in EOS."""
  return {
      "inputs": np.array([token] * (num_inputs - 1) + [EOS], np.int32),
      "targets": np.array([token + 1] * (num_targets - 1) + [EOS], np.int32)
  }


def test_pad_rows_rounds_the_longest_side_up_and_marks_each_row_one_segment():
  rows = [_pair(3, 5), _pair(17, 2)]
  batch = batching.pad_rows(rows, num_rows=4)
  assert set(batch) == set(batching.BATCH_KEYS)
  assert all(v.shape == (4, 32) and v.dtype == np.int32 for v in batch.values())  # 17 -> 32
  np.testing.assert_array_equal(batch["inputs"][0, :4], [7, 7, EOS, 0])
  np.testing.assert_array_equal(batch["targets_position"][0, :6], [0, 1, 2, 3, 4, 0])
  np.testing.assert_array_equal(batch["inputs_segmentation"][1, :18], [1] * 17 + [0])
  assert not any(v[2:].any() for v in batch.values())  # filler rows are all padding
  # A model length the rows fit caps the padding; one they do not fit does not cut a row.
  assert batching.pad_rows(rows, 4, max_length=20)["inputs"].shape == (4, 20)
  assert batching.pad_rows(rows, 4, max_length=10)["inputs"].shape == (4, 32)


def test_shard_rows_gives_each_host_a_contiguous_block():
  batch = {"inputs": np.arange(8 * 3).reshape(8, 3), "example_index": np.arange(8)}
  blocks = [batching.shard_rows(batch, i, 4) for i in range(4)]
  np.testing.assert_array_equal(blocks[1]["example_index"], [2, 3])
  for key, value in batch.items():
    np.testing.assert_array_equal(np.concatenate([b[key] for b in blocks]), value)


def test_join_pair_drops_the_first_eos_only():
  joined = batching.join_pair(_pair(3, 2, token=4), _pair(2, 3, token=9))
  np.testing.assert_array_equal(joined["inputs"], [4, 4, 9, EOS])
  np.testing.assert_array_equal(joined["targets"], [5, 10, 10, EOS])
  assert joined["inputs"].dtype == np.int32


def test_concatenated_joins_at_the_probability_and_respects_max_length():
  rng = np.random.default_rng(0)
  pairs = [{
      "inputs": np.append(rng.integers(3, 50, n), 1).astype(np.int32),
      "targets": np.append(rng.integers(3, 50, n + 1), 1).astype(np.int32)
  } for n in rng.integers(1, 4, 50)]
  source = grain.MapDataset.source(pairs)
  stream = batching.concatenated(source.repeat(), source, 0.3, 32, seed=5)
  lengths = [len(stream[i]["inputs"]) for i in range(4000)]
  joined = np.mean([n != len(pairs[i % 50]["inputs"]) for i, n in enumerate(lengths)])
  assert abs(joined - 0.3) < 0.03  # 4000 draws: standard deviation 0.007
  first = next(i for i in range(100) if len(stream[i]["inputs"]) != len(pairs[i]["inputs"]))
  element = stream[first]
  again = batching.concatenated(source.repeat(), source, 0.3, 32, seed=5)[first]
  np.testing.assert_array_equal(element["inputs"], again["inputs"])  # a function of the index
  n = len(pairs[first]["inputs"]) - 1
  np.testing.assert_array_equal(element["inputs"][:n], pairs[first]["inputs"][:n])
  second = element["inputs"][n:]
  assert any(np.array_equal(second, p["inputs"]) for p in pairs)
  # A pair longer than max_length on a side stays alone: the shortest join has 5 targets.
  short = batching.concatenated(source.repeat(), source, 1.0, 4, seed=5)
  assert all(len(short[i]["targets"]) == len(pairs[i]["targets"]) for i in range(50))


def _global_bucketed_batches(pairs, batch_size: int, num_batches: int, shard_count: int):
  """The first `num_batches` global batches of `shard_count` hosts' bucketed batches (each
  host's rows of a batch put together in host order)."""
  hosts = [
      iter(
          batching.bucketed_batches(grain.MapDataset.source(pairs), batch_size, 64, 3, i,
                                    shard_count)) for i in range(shard_count)
  ]
  batches = []
  for _ in range(num_batches):
    blocks = [next(host) for host in hosts]
    batches.append({k: np.concatenate([block[k] for block in blocks]) for k in batching.BATCH_KEYS})
  return batches


def test_bucketed_batches_sort_windows_by_length_and_hosts_split_each_global_batch():
  rng = np.random.default_rng(1)
  pairs = [
      _pair(int(n), int(m), token=3 + i % 90)
      for i, (n, m) in enumerate(rng.integers(2, 60, (256, 2)))
  ]
  batch_size, windows = 8, 2  # 2 windows of 16 batches: one epoch
  num_batches = windows * batching.BUCKET_WINDOW_BATCHES
  assert num_batches * batch_size == len(pairs)
  batches = _global_bucketed_batches(pairs, batch_size, num_batches, shard_count=1)
  ranges = []  # per batch: (shortest, longest) example, by its longer side
  for batch in batches:
    sizes = np.maximum(batch["inputs_segmentation"].sum(1), batch["targets_segmentation"].sum(1))
    assert batch["inputs"].shape == (batch_size, -(-sizes.max() // 16) * 16)
    ranges.append((sizes.min(), sizes.max()))
  for start in range(0, num_batches, batching.BUCKET_WINDOW_BATCHES):
    window = sorted(ranges[start:start + batching.BUCKET_WINDOW_BATCHES])
    assert all(a[1] <= b[0] for a, b in zip(window, window[1:]))  # sorted, then cut in batches
  assert ranges != sorted(ranges)  # the window's batches come in a shuffled order
  seen = sorted(
      tuple(batch["inputs"][row, :batch["inputs_segmentation"][row].sum()])
      for batch in batches
      for row in range(batch_size))
  assert seen == sorted(tuple(p["inputs"]) for p in pairs)  # every example once in the epoch
  # Two hosts take the halves of the same global batches.
  for one, two in zip(batches, _global_bucketed_batches(pairs, batch_size, num_batches, 2)):
    for key in batching.BATCH_KEYS:
      np.testing.assert_array_equal(one[key], two[key])
