"""relpos.data.packing against grain's FirstFitPackIterDataset (the reference it replaces)."""

from collections import Counter

import grain
import numpy as np
import pytest

from relpos.data import packing

ROWS, LENGTH, SEED = 8, 16, 3


def _examples(count: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
  """Random examples of 1-16 tokens a side (ids 2-99), some at the full row length."""
  rng = np.random.default_rng(seed)

  def tokens() -> np.ndarray:
    return rng.integers(2, 100, rng.integers(1, LENGTH + 1)).astype(np.int32)

  return [{k: tokens() for k in packing.FEATURES} for _ in range(count)]


def _stream(examples) -> grain.IterDataset:
  return (grain.MapDataset.source(examples).seed(7).shuffle().repeat().to_iter_dataset(
      grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)))


def _grain_batches(examples) -> grain.DatasetIterator:
  """grain's packer, its keys renamed to relpos's."""
  packed = grain.experimental.FirstFitPackIterDataset(
      _stream(examples), length_struct={k: LENGTH for k in packing.FEATURES}, num_packing_bins=ROWS,
      seed=SEED)
  names = {
      f"{k}_{theirs}": f"{k}_{ours}" for k in packing.FEATURES
      for theirs, ours in (("segment_ids", "segmentation"), ("positions", "position"))
  }
  return iter(
      packed.batch(ROWS).map(
          lambda batch: {names.get(k, k): np.asarray(v, np.int32) for k, v in batch.items()}))


def _relpos_batches(examples) -> grain.DatasetIterator:
  return iter(packing.FirstFitPackedBatches(_stream(examples), rows=ROWS, length=LENGTH, seed=SEED))


def _assert_same_batch(ours, theirs):
  assert sorted(ours) == sorted(theirs)
  for key in theirs:
    assert ours[key].dtype == np.int32 and ours[key].shape == (ROWS, LENGTH), key
    np.testing.assert_array_equal(ours[key], theirs[key], err_msg=key)


def test_same_batches_and_states_as_grain_over_several_epochs():
  examples = _examples(60)
  ours, theirs = _relpos_batches(examples), _grain_batches(examples)
  assert ours.get_state() == theirs.get_state()
  for _ in range(40):  # about 10 epochs of the 60 examples
    _assert_same_batch(next(ours), next(theirs))
    assert ours.get_state() == theirs.get_state()


@pytest.mark.parametrize("saved_by", ["relpos", "grain"])
def test_a_state_saved_by_either_resumes_the_other(saved_by):
  examples = _examples(50, seed=1)
  saver = _relpos_batches(examples) if saved_by == "relpos" else _grain_batches(examples)
  for _ in range(7):
    next(saver)
  state = saver.get_state()
  expected = [next(saver) for _ in range(5)]
  ours, theirs = _relpos_batches(examples), _grain_batches(examples)
  ours.set_state(state)
  theirs.set_state(state)
  for batch in expected:
    _assert_same_batch(next(ours), batch)
    _assert_same_batch(next(theirs), batch)


def test_rows_hold_every_token_once_with_restarting_positions():
  """Over several batches (about 3 epochs of 40 examples), each row's segments number 1, 2, ...
  with positions restarting at 0, and the segments are the stream's examples in full, each
  once: every example the batches took from the stream, none twice, none lost, none cut."""
  examples = _examples(40, seed=2)
  batches = _relpos_batches(examples)
  segments = []
  for _ in range(8):
    batch = next(batches)
    for row in range(ROWS):
      sides = {}
      for k in packing.FEATURES:
        segmentation = batch[f"{k}_segmentation"][row]
        count = segmentation.max()
        assert count >= 1 and set(segmentation[segmentation > 0]) == set(range(1, count + 1))
        for segment in range(1, count + 1):
          where = segmentation == segment
          np.testing.assert_array_equal(batch[f"{k}_position"][row][where], np.arange(where.sum()))
        assert not batch[k][row][segmentation == 0].any()
        sides[k] = [tuple(batch[k][row][segmentation == s]) for s in range(1, count + 1)]
      assert len(sides["inputs"]) == len(sides["targets"])
      segments += zip(sides["inputs"], sides["targets"])
  stream = iter(_stream(examples))
  taken = [next(stream) for _ in range(len(segments))]  # the batches' share of the stream
  assert Counter(segments) == Counter(
      (tuple(example["inputs"]), tuple(example["targets"])) for example in taken)
  assert len(segments) > 2 * len(examples)  # into the third epoch


def test_an_example_longer_than_a_row_is_refused():
  examples = [{"inputs": np.ones(LENGTH + 1, np.int32), "targets": np.ones(3, np.int32)}]
  with pytest.raises(ValueError,
                     match="17 input and 3 target tokens does not fit packed rows of 16"):
    next(_relpos_batches(examples))


def test_resuming_inside_a_packed_batch_is_refused():
  iterator = _relpos_batches(_examples(20))
  with pytest.raises(ValueError, match="next_row > 0"):
    iterator.set_state({"parent": {"next_index": 0}, "next_row": 3, "counter": 3})
