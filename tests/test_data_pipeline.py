"""Tests for relpos.data.pipeline: packing, bucketing, resume, sharding, eval batches."""

import json
import re
import shutil
from collections import Counter

import numpy as np
import pytest

from configs import default
from relpos.data import batching
from relpos.data import datasets
from relpos.data import pipeline
from relpos.data import synthetic
from relpos.data import tokenizer as tokenizer_lib

NUM_TRAIN = 300


def _task_config(data_dir, **fields):
  config = default.get_config().task
  config.tfds_data_dir = str(data_dir)
  config.vocab_size = 120
  config.synthetic.update(num_train=NUM_TRAIN, num_validation=20, num_test=30, num_test_long=10)
  config.update(**fields)
  return config


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return tmp_path_factory.mktemp("tfds")


@pytest.fixture(scope="module")
def task(data_dir):
  return pipeline.Task(_task_config(data_dir, max_length=32))


@pytest.fixture(scope="module")
def bucketed_task(data_dir):
  return pipeline.Task(_task_config(data_dir, max_length=48, packing=False))


@pytest.fixture(scope="module")
def concat_task(data_dir):
  return pipeline.Task(_task_config(data_dir, max_length=32, concat_probability=0.5))


def _key(inputs, targets) -> tuple:
  return tuple(inputs), tuple(targets)


def _segments(batch) -> list[tuple]:
  """The (inputs, targets) token sequences of every packed segment of a batch.

  Also checks each row: positions restart at 0 in every segment, padding is PAD_ID with
  position and segment 0, and inputs and targets hold the same segments.
  """
  out = []
  for row in range(len(batch["inputs"])):
    sides = {}
    for key in pipeline.FEATURES:
      tokens, segments = batch[key][row], batch[f"{key}_segmentation"][row]
      positions = batch[f"{key}_position"][row]
      ids = [s for s in np.unique(segments) if s]
      assert ids == list(range(1, len(ids) + 1))
      for s in ids:
        np.testing.assert_array_equal(positions[segments == s], np.arange((segments == s).sum()))
      assert not tokens[segments == 0].any() and not positions[segments == 0].any()
      sides[key] = [tokens[segments == s] for s in ids]
    assert len(sides["inputs"]) == len(sides["targets"])
    out += [_key(i, t) for i, t in zip(sides["inputs"], sides["targets"])]
  return out


def _examples(task, shard_index=0, shard_count=1) -> Counter:
  examples, _ = task.train_examples()
  return Counter(
      _key(examples[i]["inputs"], examples[i]["targets"])
      for i in range(shard_index, len(examples), shard_count))


def _segments_until(iterator, size: int) -> Counter:
  """Segments of the batches [8, 32] until at least `size` were seen."""
  seen = []
  while len(seen) < size:
    batch = next(iterator)
    assert all(v.shape == (8, 32) and v.dtype == np.int32 for v in batch.values())
    seen += _segments(batch)
  return Counter(seen)


def _assert_covers(seen: Counter, expected: Counter):
  """`seen` holds every expected example; the surplus is the start of a second epoch (expected
  examples, none more often than in one epoch)."""
  assert not expected - seen
  surplus = seen - expected
  assert not surplus - expected and surplus.total() < expected.total()


def test_packing_restarts_positions_and_loses_no_token(task):
  """The batches hold whole, consecutive examples of the shuffled stream: once at least one
  epoch's worth was packed, every example is there."""
  expected = _examples(task)
  seen = _segments_until(task.train_iterator(8, seed=0), expected.total())
  _assert_covers(seen, expected)
  assert seen.total() > 8 * 3  # packing put several sentences in a row


def test_hosts_pack_disjoint_shards(task):
  with pytest.raises(ValueError, match="not divisible by 3 hosts"):
    task.train_iterator(8, seed=0, shard_count=3)
  for host in range(2):
    expected = _examples(task, host, 2)
    _assert_covers(
        _segments_until(task.train_iterator(16, seed=0, shard_index=host, shard_count=2),
                        expected.total()), expected)


def _assert_same_batches(iterator, expected):
  for want in expected:
    got = next(iterator)
    assert got.keys() == want.keys()
    for key in want:
      np.testing.assert_array_equal(got[key], want[key])


@pytest.mark.parametrize("fixture", ["task", "bucketed_task", "concat_task"])
def test_restored_iterator_yields_the_same_next_batches(fixture, request):
  task = request.getfixturevalue(fixture)
  iterator = task.train_iterator(8, seed=3)
  for _ in range(20):  # past the first bucketing window
    next(iterator)
  state = json.loads(json.dumps(iterator.get_state()))  # as saved with a checkpoint
  expected = [next(iterator) for _ in range(4)]
  fresh = task.train_iterator(8, seed=3)
  fresh.set_state(state)
  _assert_same_batches(fresh, expected)
  _assert_same_batches(task.train_iterator(8, seed=3), [next(task.train_iterator(8, seed=3))])
  other_seed = next(task.train_iterator(8, seed=4))
  assert not np.array_equal(other_seed["inputs"], next(task.train_iterator(8, seed=3))["inputs"])


@pytest.mark.parametrize("fixture", ["task", "bucketed_task"])
def test_prefetching_changes_no_batch_and_no_saved_state(fixture, request, monkeypatch):
  task = request.getfixturevalue(fixture)
  prefetched = task.train_iterator(8, seed=3)
  monkeypatch.setattr(pipeline, "TRAIN_PREFETCH_BATCHES", 0)
  inline = task.train_iterator(8, seed=3)
  _assert_same_batches(prefetched, [next(inline) for _ in range(6)])
  assert prefetched.get_state() == inline.get_state()  # the position after the batches taken
  monkeypatch.undo()
  resumed = task.train_iterator(8, seed=3)  # prefetching, from a state saved without it
  resumed.set_state(json.loads(json.dumps(inline.get_state())))
  _assert_same_batches(resumed, [next(inline) for _ in range(3)])


def test_bucketed_batches_group_lengths_and_cover_an_epoch(bucketed_task):
  iterator = bucketed_task.train_iterator(10, seed=0)
  window = batching.BUCKET_WINDOW_BATCHES
  batches = [next(iterator) for _ in range(2 * window)]
  lengths = set()
  for batch in batches:
    for key in pipeline.FEATURES:
      tokens = batch[key] != 0
      np.testing.assert_array_equal(batch[f"{key}_segmentation"], tokens)
      np.testing.assert_array_equal(batch[f"{key}_position"],
                                    np.where(tokens, np.arange(tokens.shape[1]), 0))
    longest = max((batch[k] != 0).sum(1).max() for k in pipeline.FEATURES)
    length = batch["inputs"].shape[1]
    assert length == min(48, -(-longest // 16) * 16)
    lengths.add(length)
  assert len(lengths) > 1
  # Whole windows are consecutive stream examples: two of them span the first epoch.
  expected = _examples(bucketed_task)
  assert 2 * window * 10 >= expected.total()
  _assert_covers(Counter(s for batch in batches for s in _rows(batch)), expected)


def _rows(batch) -> list[tuple]:
  return [_key(i[i != 0], t[t != 0]) for i, t in zip(batch["inputs"], batch["targets"])]


def test_bucketed_hosts_take_contiguous_rows_of_the_same_global_batch(bucketed_task):
  global_batch = next(bucketed_task.train_iterator(8, seed=1))
  for host in range(2):
    local = next(bucketed_task.train_iterator(8, seed=1, shard_index=host, shard_count=2))
    for key in pipeline.BATCH_KEYS:
      np.testing.assert_array_equal(local[key], global_batch[key][4 * host:4 * host + 4])


@pytest.mark.parametrize("overlong", ["filter", "truncate"])
def test_overlong_examples_are_counted(data_dir, overlong, caplog):
  task = pipeline.Task(_task_config(data_dir, max_length=12, overlong=overlong))
  with caplog.at_level("WARNING"):  # what a run shows by default
    examples, stats = task.train_examples()
  everything = task.eval_examples("train")  # the split untouched, in the same order
  sides = [(everything[i]["inputs"], everything[i]["targets"]) for i in range(len(everything))]
  overlong_ones = [i for i, pair in enumerate(sides) if max(map(len, pair)) > 12]
  assert any(max(map(len, pair)) == 12 for pair in sides)  # the limit itself is kept
  assert stats.num_examples == NUM_TRAIN and stats.action == overlong
  assert stats.num_overlong == len(overlong_ones) > 0
  assert f"{stats.num_overlong} of {NUM_TRAIN} examples (" in caplog.text
  assert len(examples) == (NUM_TRAIN - stats.num_overlong if overlong == "filter" else NUM_TRAIN)
  if overlong == "filter":  # the others, whole and in order
    kept = [pair for i, pair in enumerate(sides) if i not in set(overlong_ones)]
    for i in range(0, len(examples), 37):
      assert [list(examples[i][key]) for key in ("inputs", "targets")] == list(map(list, kept[i]))
  if overlong == "truncate":  # the first 11 ids of each side, then EOS
    for i in overlong_ones[:20]:
      for key, ids in zip(("inputs", "targets"), sides[i]):
        expected = list(ids) if len(ids) <= 12 else list(ids[:11]) + [tokenizer_lib.EOS_ID]
        assert list(examples[i][key]) == expected
  for key in pipeline.FEATURES:
    assert examples.lengths(key).max() <= 12
    for i in range(len(examples)):  # one EOS, at the end
      assert list(examples[i][key]).index(tokenizer_lib.EOS_ID) == len(examples[i][key]) - 1


def test_nothing_fits(data_dir):
  task = pipeline.Task(_task_config(data_dir, max_length=2))
  with pytest.raises(ValueError, match="no training example .* fits task.max_length=2"):
    task.train_examples()


def test_eval_batches_cover_the_whole_split_untruncated(data_dir):
  task = pipeline.Task(_task_config(data_dir, max_length=8))  # eval ignores max_length
  batches = list(task.eval_batches("test_long", 4))
  indices = np.concatenate([b["example_index"] for b in batches])
  np.testing.assert_array_equal(indices, list(range(10)) + [-1, -1])
  sources, targets = task.source_texts("test_long"), task.target_texts("test_long")
  for batch in batches:
    assert batch["inputs"].shape[1] % batching.LENGTH_MULTIPLE == 0
    for row, index in enumerate(batch["example_index"]):
      if index >= 0:
        assert task.tokenizer.decode(batch["inputs"][row]) == sources[index]
        assert task.tokenizer.decode(batch["targets"][row]) == targets[index]
      else:
        assert not any(batch[k][row].any() for k in pipeline.BATCH_KEYS)
  assert max(b["inputs"].shape[1] for b in batches) > 8


def test_eval_batches_are_padded_no_further_than_a_model_length_they_fit(data_dir):
  """A learned absolute table has no position past model.max_len: a validation batch of
  sentences that fit it is not padded past it (a run crashed at its first validation)."""
  task = pipeline.Task(_task_config(data_dir))
  unlimited = list(task.eval_batches("test_long", 4))
  longest = [
      max(int(b[f"{k}_segmentation"].sum(1).max()) for k in pipeline.FEATURES) for b in unlimited
  ]
  assert any(n % batching.LENGTH_MULTIPLE for n in longest)
  fitting = list(task.eval_batches("test_long", 4, max_len=max(longest)))
  for batch, capped, n in zip(unlimited, fitting, longest):
    assert capped["inputs"].shape[1] == min(batch["inputs"].shape[1], max(longest))
    for key in pipeline.BATCH_KEYS:
      np.testing.assert_array_equal(capped[key], batch[key][:, :capped[key].shape[1]])
  too_short = list(task.eval_batches("test_long", 4, max_len=min(longest) - 1))
  assert [b["inputs"].shape for b in too_short] == [b["inputs"].shape for b in unlimited]


def test_subsets_say_what_each_held_out_split_holds(task):
  sources = task.source_texts("test_long")
  subsets = dict(task.subsets("test_long"))
  assert sorted(i for indices in subsets.values() for i in indices) == list(range(10))
  for name, indices in subsets.items():
    assert all(synthetic.long_sentence_construction(sources[i]) == name for i in indices)
  train = set(zip(task.source_texts("train"), task.target_texts("train")))
  test = list(zip(task.source_texts("test"), task.target_texts("test")))
  seen = dict(task.subsets("test"))["in training"]
  assert seen == [i for i, pair in enumerate(test) if pair in train]


def test_task_api(task, data_dir):
  assert task.splits == ("train", "validation", "test", "test_long")
  # Known before preparing: the splits the task's parameters make (test_long_seen where asked).
  assert pipeline.split_names(task.config) == task.splits
  with_seen = _task_config(data_dir, max_length=32)
  with_seen.synthetic.num_test_long_seen = 10
  assert pipeline.split_names(with_seen) == task.splits + ("test_long_seen",)
  assert len(task.source_texts("validation")) == len(task.target_texts("validation")) == 20
  assert pipeline.get_task(_task_config(data_dir, max_length=32)) is pipeline.get_task(
      _task_config(data_dir, max_length=32))
  with pytest.raises(ValueError, match="split='dev' is not a split of task 'synthetic'"):
    task.source_texts("dev")
  with pytest.raises(
      ValueError, match=re.escape(
          "split='test_long_seen' is not a split of task 'synthetic' (set "
          "task.synthetic.num_test_long_seen to make it); allowed: train, validation, test, "
          "test_long.")):
    task.source_texts("test_long_seen")
  with pytest.raises(ValueError, match="task.name='imdb'"):
    pipeline.Task(_task_config(data_dir, name="imdb"))


def test_tokenizer_is_cached_beside_the_data(task, data_dir):
  cached = pipeline.Task(_task_config(data_dir, max_length=32))
  assert cached.tokenizer.path == task.tokenizer.path
  assert cached.tokenizer.model_proto() == task.tokenizer.model_proto()
  assert task.tokenizer.path.startswith(str(data_dir / "relpos_tokenizers"))
  other = pipeline.Task(_task_config(data_dir, vocab_size=100))
  assert other.tokenizer.path != task.tokenizer.path


def test_references_the_tokenizer_cannot_write_are_warned_of_once(data_dir, monkeypatch, caplog):
  task = pipeline.Task(_task_config(data_dir, max_length=32))
  assert task.check_references("test") == []  # the synthetic task's references all round-trip
  references = task.target_texts("validation")
  changed = ["x…", references[2] + "  "]  # "…" was never seen; the spaces are not words
  monkeypatch.setattr(task, "target_texts", lambda split: references[:2] + changed)
  for _ in range(2):
    assert task.check_references("validation") == [2]
  warned = [r.getMessage() for r in caplog.records if "round trip" in r.getMessage()]
  assert warned == [
      "1 of 4 references of split 'validation' of task synthetic do not survive the tokenizer's "
      "round trip (its normalization, or characters unseen in training): no translation can "
      "match them exactly. The first (number 3): 'x…' decodes as 'x ⁇ '."
  ]


def test_tokenizer_larger_than_the_model_vocabulary_is_refused(task, data_dir):
  """A tokenizer file with more pieces than task.vocab_size would feed ids past the embedding."""
  path = task.tokenizer.path.replace("-120-", "-16-")
  shutil.copyfile(task.tokenizer.path, path)
  with pytest.raises(
      ValueError, match=f"{path} holds {task.tokenizer.vocab_size} pieces, more "
      "than task.vocab_size=16"):
    pipeline.Task(_task_config(data_dir, vocab_size=16))


def test_concat_probability_zero_is_the_pipeline_without_the_option(data_dir, task, concat_task,
                                                                    monkeypatch):
  """p = 0 (the default) and a config written before the option existed never call
  `concatenated`: the same batches, every segment a training pair alone; p = 0.5's differ."""
  assert task.config.concat_probability == 0.0
  joined = next(concat_task.train_iterator(8, seed=0))
  config = _task_config(data_dir, max_length=32)
  del config["concat_probability"]  # a config written before the option existed

  def refuse(*args, **kwargs):
    raise AssertionError("concatenated called with concat_probability 0")

  monkeypatch.setattr(batching, "concatenated", refuse)
  before = pipeline.Task(config).train_iterator(8, seed=0)
  batches = [next(before) for _ in range(6)]
  _assert_same_batches(task.train_iterator(8, seed=0), batches)
  examples = _examples(task)
  assert all(segment in examples for batch in batches for segment in _segments(batch))
  assert not np.array_equal(joined["inputs"], batches[0]["inputs"])


def _is_joined(inputs: tuple, targets: tuple, examples: Counter) -> bool:
  """Whether (inputs, targets) is a training pair without its final EOS, then another."""
  for first_inputs, first_targets in examples:
    n, m = len(first_inputs) - 1, len(first_targets) - 1
    if (inputs[:n] == first_inputs[:-1] and targets[:m] == first_targets[:-1] and
        (inputs[n:], targets[m:]) in examples):
      return True
  return False


def test_concatenated_examples_are_two_joined_pairs_at_the_rate(concat_task):
  examples = _examples(concat_task)
  assert all(key[0][-1] == key[1][-1] == tokenizer_lib.EOS_ID for key in examples)
  segments = _segments_until(concat_task.train_iterator(8, seed=0), 600)
  joined = 0
  for (inputs, targets), count in segments.items():
    if (inputs, targets) not in examples:
      assert _is_joined(inputs, targets, examples), (inputs, targets)
      joined += count
  # p = 0.5, less the pairs that would exceed max_length = 32 tokens (they stay alone).
  assert 0.1 < joined / segments.total() < 0.5


def _damage(folder, damage: str) -> None:
  """Damages a prepared dataset folder as a full disk or a partial copy would."""
  shard = sorted(folder.glob("*-train.array_record-*"))[0]
  if damage == "deleted shard":
    shard.unlink()
  elif damage == "shard cut to 1000 bytes":
    shard.write_bytes(shard.read_bytes()[:1000])
  elif damage == "shard cut to half":  # read back as examples without text, with no error
    shard.write_bytes(shard.read_bytes()[:shard.stat().st_size // 2])
  else:
    (folder / "dataset_info.json").write_text("garbage{", encoding="utf-8")


@pytest.mark.parametrize(
    "damage, cause",
    [("deleted shard", r"open\(\) failed: No such file or directory"),
     ("shard cut to 1000 bytes", r"ArrayRecord file should be at least 64KB big"),
     ("shard cut to half", r"example 0 of split 'train' has no source text: a truncated shard"),
     ("garbage dataset_info.json", r"Failed to load JSON")])
def test_damaged_prepared_data_names_its_folder(task, tmp_path, damage, cause):
  root = tmp_path / "data"
  shutil.copytree(task.info.data_dir.rsplit("/synthetic_translation/", 1)[0], root)
  folder = root / task.info.data_dir.rsplit("/synthetic_translation/", 1)[1].join(
      ["synthetic_translation/", ""])
  _damage(folder, damage)
  with pytest.raises(
      datasets.DamagedDataError,
      match=(rf"^prepared data in {folder} is damaged \({cause}.*\): move it aside \(mv {folder} "
             rf"{folder}.damaged\) and run again to prepare it again.$")):
    pipeline.Task(_task_config(root, max_length=32))
  folder.rename(f"{folder}.damaged")  # what the message says: the next run prepares it again
  again = pipeline.Task(_task_config(root, max_length=32))
  assert again.source_texts("train") == task.source_texts("train")


def test_damaged_tokenizer_is_set_aside_and_trained_again(task, tmp_path, caplog):
  root = tmp_path / "data"
  shutil.copytree(task.info.data_dir.rsplit("/synthetic_translation/", 1)[0], root)
  path = root / "relpos_tokenizers" / task.tokenizer.path.rsplit("/", 1)[1]
  path.write_bytes(b"garbage")
  again = pipeline.Task(_task_config(root, max_length=32))
  assert again.tokenizer.model_proto() == task.tokenizer.model_proto()
  assert (root / "relpos_tokenizers" / (path.name + ".damaged")).read_bytes() == b"garbage"
  assert f"{path} is not a SentencePiece model" in caplog.text
