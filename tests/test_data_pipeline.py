"""Tests for relpos.data.pipeline: packing, bucketing, resume, sharding, eval batches."""

import numpy as np
import pytest

from configs import default
from relpos.data import pipeline
from relpos.data import tokenizer as tokenizer_lib


def _task_config(data_dir, **fields):
  config = default.get_config().task
  config.tfds_data_dir = str(data_dir)
  config.vocab_size = 120
  config.synthetic.update(num_train=300, num_validation=20, num_test=30, num_test_long=10)
  config.update(**fields)
  return config


@pytest.fixture(scope="module")
def task(tmp_path_factory):
  return pipeline.Task(_task_config(tmp_path_factory.mktemp("tfds"), max_length=32))


def _segments(row_tokens, row_segments, row_positions):
  """The token sequences of each segment of one packed row."""
  out = []
  for segment in range(1, row_segments.max() + 1):
    where = row_segments == segment
    np.testing.assert_array_equal(row_positions[where], np.arange(where.sum()))
    out.append(tuple(row_tokens[where]))
  return out


def test_packed_batches_keep_every_token_and_restart_positions(task):
  iterator = task.train_iterator(8, seed=0)
  examples, _ = task.train_examples()
  seen, tokens_in_batches = [], 0
  for _ in range(5):
    batch = next(iterator)
    tokens_in_batches += int((batch["inputs"] != tokenizer_lib.PAD_ID).sum())
    assert set(batch) == set(pipeline.BATCH_KEYS)
    assert all(v.shape == (8, 32) and v.dtype == np.int32 for v in batch.values())
    for row in range(8):
      inputs = _segments(batch["inputs"][row], batch["inputs_segmentation"][row],
                         batch["inputs_position"][row])
      targets = _segments(batch["targets"][row], batch["targets_segmentation"][row],
                          batch["targets_position"][row])
      assert len(inputs) == len(targets)
      seen += list(zip(inputs, targets))
      padding = batch["inputs_segmentation"][row] == 0
      assert (batch["inputs"][row][padding] == tokenizer_lib.PAD_ID).all()
  # Consecutive stream examples, whole: every token of each of them is in the batches.
  consumed = iterator.get_state()["position"]
  assert len(seen) == consumed
  bank = {(tuple(e["inputs"]), tuple(e["targets"])) for e in examples}
  assert all(pair in bank for pair in seen)
  assert tokens_in_batches == sum(len(s) for s, _ in seen)
  assert len(seen) > 8 * 5  # packing put several sentences in a row


def test_iterator_state_restores_the_same_next_batches(task):
  iterator = task.train_iterator(8, seed=3)
  for _ in range(3):
    next(iterator)
  state = iterator.get_state()
  expected = [next(iterator) for _ in range(4)]
  fresh = task.train_iterator(8, seed=3)
  fresh.set_state(state)
  for want in expected:
    got = next(fresh)
    for key in pipeline.BATCH_KEYS:
      np.testing.assert_array_equal(got[key], want[key])
  other_seed = next(task.train_iterator(8, seed=4))
  assert not np.array_equal(other_seed["inputs"], expected[0]["inputs"])


def test_epochs_are_reshuffled_and_hosts_get_disjoint_shards(task):
  examples, _ = task.train_examples()
  n = len(examples)
  stream = task.train_iterator(8, seed=0)._stream  # pylint: disable=protected-access
  first = [tuple(stream[i]["inputs"]) for i in range(n)]
  second = [tuple(stream[n + i]["inputs"]) for i in range(n)]
  assert sorted(first) == sorted(second) and first != second
  shards = [task.train_iterator(8, seed=0, shard_index=i, shard_count=2)._stream  # pylint: disable=protected-access
            for i in range(2)]
  halves = [{tuple(s[i]["inputs"]) + (-1,) + tuple(s[i]["targets"]) for i in range(n // 2)}
            for s in shards]
  assert len(halves[0] & halves[1]) <= 2  # disjoint up to duplicate sentences
  with pytest.raises(ValueError, match="not divisible by 3 hosts"):
    task.train_iterator(8, seed=0, shard_count=3)


def test_unpacked_batches_are_length_bucketed(tmp_path):
  task = pipeline.Task(_task_config(tmp_path, packing=False, max_length=48))
  batch = next(task.train_iterator(4, seed=0))
  length = batch["inputs"].shape[1]
  assert length % pipeline.EVAL_LENGTH_MULTIPLE == 0 and length <= 48
  longest = max(int((batch[k] != 0).sum(1).max()) for k in ("inputs", "targets"))
  assert length - pipeline.EVAL_LENGTH_MULTIPLE < longest <= length
  np.testing.assert_array_equal(batch["inputs_segmentation"], (batch["inputs"] != 0))


@pytest.mark.parametrize("overlong", ["filter", "truncate"])
def test_overlong_examples_are_counted(tmp_path, overlong):
  task = pipeline.Task(_task_config(tmp_path, max_length=12, overlong=overlong))
  examples, stats = task.train_examples()
  assert stats.num_examples == 300 and stats.action == overlong
  assert 0 < stats.num_overlong < 300
  assert len(examples) == (300 - stats.num_overlong if overlong == "filter" else 300)
  for example in examples:
    assert len(example["inputs"]) <= 12 and example["inputs"][-1] == tokenizer_lib.EOS_ID


def test_eval_batches_cover_the_whole_split_untruncated(tmp_path):
  task = pipeline.Task(_task_config(tmp_path, max_length=8))  # eval ignores max_length
  batches = list(task.eval_batches("test_long", 4))
  indices = np.concatenate([b["example_index"] for b in batches])
  assert sorted(indices[indices >= 0]) == list(range(10))
  assert (indices[10:] == -1).all()
  sources = task.source_texts("test_long")
  for batch in batches:
    for row, index in enumerate(batch["example_index"]):
      if index >= 0:
        assert task.tokenizer.decode(batch["inputs"][row]) == sources[index]
      else:
        assert not batch["inputs"][row].any()
  assert batches[0]["inputs"].shape[1] > 8


def test_synthetic_splits_and_metadata(task):
  assert task.splits == ("train", "validation", "test", "test_long")
  assert 0 < task.info.metadata["test_permutation_fraction"] < 1
  longest_train = max(len(s.split()) for s in task.source_texts("train"))
  assert min(len(s.split()) for s in task.source_texts("test_long")) > longest_train
  with pytest.raises(ValueError, match="split 'dev' is not a split of task 'synthetic'"):
    task.source_texts("dev")


def test_unknown_task_and_wmt14_languages(tmp_path):
  with pytest.raises(ValueError, match="task.name='imdb'"):
    pipeline.Task(_task_config(tmp_path, name="imdb"))
  with pytest.raises(ValueError, match="task.target_lang='fr'.*de, en"):
    pipeline.Task(_task_config(tmp_path, name="wmt14", source_lang="en", target_lang="fr"))


def test_wmt14_through_tfds_mock_data(tmp_path):
  """The catalog's WMT14 builder imports TensorFlow to be found, so this needs it installed."""
  pytest.importorskip("tensorflow")
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  with tfds.testing.mock_data(num_examples=12):
    task = pipeline.Task(_task_config(tmp_path, name="wmt14", source_lang="en", target_lang="de"))
    assert len(task.source_texts("train")) == 12
    assert next(task.train_iterator(2, seed=0))["inputs"].shape == (2, 48)
