"""The input pipeline: TFDS array_record data -> SentencePiece -> grain batches.

`get_task(config.task)` prepares the task's TFDS dataset (once, in the TFDS data dir), its
tokenizer (trained on the train split on first use, cached beside the data) and returns a
`Task`. TensorFlow is not needed: data is read with `builder.as_data_source()` and grain.

Batches are dicts of int32 numpy arrays [batch, length] with the keys of BATCH_KEYS, made by
`relpos.data.batching` (which says what each key holds). Evaluation batches add
"example_index" [batch]: the row's index in the split, -1 on the all-padding filler rows of
the last batch.
"""

import dataclasses
import functools
import os
from collections.abc import Callable, Iterator, Sequence

import grain
import jax
import ml_collections
import numpy as np
from absl import logging
from google.protobuf import json_format

from relpos.data import batching
from relpos.data import datasets
from relpos.data import multi30k
from relpos.data import synthetic
from relpos.data import tokenizer as tokenizer_lib
from relpos.data import wmt14

BATCH_KEYS = batching.BATCH_KEYS
FEATURES = batching.FEATURES
# Examples tokenized at a time (tokenizing runs on several threads).
CHUNK = 4096
# Training batches made ahead by a background thread while the device runs a step (reading
# and packing are Python: about 14 ms a synthetic batch and 41 ms a Multi30K GPU-recipe batch
# on 2 CPU cores, against 34 and 90 ms with grain's generic packer).
TRAIN_PREFETCH_BATCHES = 2

_LOADERS: dict[str, Callable[[ml_collections.ConfigDict, str], datasets.PairDataset]] = {
    "synthetic": synthetic.load, "multi30k": multi30k.load, "wmt14": wmt14.load
}

# The splits a task's config may not make, and what makes each (`check_split` says it).
SPLITS_MADE_BY = {"synthetic": synthetic.MADE_BY}


def split_names(task_config: ml_collections.ConfigDict) -> tuple[str, ...]:
  """The splits `task_config`'s task has, known before its data is prepared: a synthetic task's
  those its parameters make; Multi30K's every split it can have (once prepared, its optional
  test splits are there only where their files were: `Task.splits`); WMT14's three.

  Raises:
    ValueError: naming the field, for synthetic parameters that make no data.
  """
  if task_config.name == "synthetic":
    return synthetic.SyntheticParams.of(task_config).split_names()
  return {"multi30k": tuple(multi30k.SPLIT_STEMS), "wmt14": wmt14.SPLITS}[task_config.name]


def check_split(split: str | None, task_name: str, allowed: Sequence[str]) -> None:
  """Raises ValueError, naming the allowed splits, if split (None: no split asked) is not one
  of them; the one wording for the data pipeline and `eval.py --split`."""
  if split is not None and split not in allowed:
    made = f" ({SPLITS_MADE_BY[task_name][split]})" if split in SPLITS_MADE_BY.get(task_name,
                                                                                   {}) else ""
    raise ValueError(f"split={split!r} is not a split of task {task_name!r}{made}; allowed: "
                     f"{', '.join(allowed)}.")


def _text(value: bytes | str) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


class TokenizedPairs:
  """Tokenized (inputs, targets) pairs in flat int32 arrays (compact even for WMT14).

  A random-access source for grain: `pairs[i]` is {"inputs": [n] int32, "targets": [m] int32}.
  """
  def __init__(self, tokens: dict[str, np.ndarray], lengths: dict[str, np.ndarray]):
    """Args: tokens: feature -> every example's ids, concatenated [total] int32;
    lengths: feature -> each example's token count [num_examples]."""
    self._tokens = tokens
    self._offsets = {k: np.concatenate([[0], np.cumsum(lengths[k])]) for k in FEATURES}

  def __len__(self) -> int:
    return len(self._offsets["inputs"]) - 1

  def __getitem__(self, index: int) -> dict[str, np.ndarray]:
    return {
        k: self._tokens[k][self._offsets[k][index]:self._offsets[k][index + 1]] for k in FEATURES
    }

  def lengths(self, feature: str) -> np.ndarray:
    """Token counts [num_examples] of `feature` ("inputs" or "targets")."""
    return np.diff(self._offsets[feature])


@dataclasses.dataclass(frozen=True)
class FilterStats:
  """What the length limit did to the training examples.

  Attributes:
    num_examples: examples in the train split (before the limit).
    num_overlong: of these, examples with more than task.max_length tokens on a side.
    action: "filter" (they were dropped) or "truncate" (cut to max_length, ending with EOS).
  """
  num_examples: int
  num_overlong: int
  action: str


def _check_vocab_size(tokenizer: tokenizer_lib.Tokenizer, vocab_size: int) -> None:
  """Logs the ids the model has beyond a smaller tokenizer; refuses a larger one.

  Raises:
    ValueError: the tokenizer file holds more pieces than the model's `task.vocab_size`.
  """
  if tokenizer.vocab_size > vocab_size:
    raise ValueError(f"{tokenizer.path} holds {tokenizer.vocab_size} pieces, more than "
                     f"task.vocab_size={vocab_size}; delete it to train a new tokenizer.")
  if tokenizer.vocab_size < vocab_size:
    logging.info(
        "task.vocab_size=%d, but the tokenizer found %d pieces: ids %d-%d are never "
        "targets and are never decoded.", vocab_size, tokenizer.vocab_size, tokenizer.vocab_size,
        vocab_size - 1)


def _load(name: str, task_config: ml_collections.ConfigDict, root: str) -> datasets.PairDataset:
  """The task's prepared dataset (prepared first when missing).

  Raises:
    datasets.DamagedDataError: its dataset_info.json is not JSON, naming the folder.
  """
  try:
    return _LOADERS[name](task_config, root)
  except json_format.Error as e:  # TFDS reads dataset_info.json building the builder
    folders = datasets.unreadable_info_folders(root) or [root]
    raise datasets.damaged(folders[0], e) from None


class Task:
  """A prepared translation task: its splits, texts, tokenizer and batch iterators."""
  def __init__(self, task_config: ml_collections.ConfigDict):
    """Prepares the TFDS dataset and the tokenizer of `task_config` (config.task).

    Raises:
      ValueError: an unknown task or language, or bad data files (named); a damaged prepared
        dataset (`datasets.DamagedDataError`, naming its folder and how to prepare it again).
      FileNotFoundError: missing data files (named), or WMT14 not prepared and TensorFlow
        missing to prepare it.
    """
    if task_config.name not in _LOADERS:
      raise ValueError(f"config field task.name={task_config.name!r} is invalid: must be one "
                       f"of {', '.join(_LOADERS)}.")
    self.name = task_config.name
    self.config = task_config
    root = datasets.data_dir(task_config)
    self._dataset = _load(self.name, task_config, root)
    builder = self._dataset.builder
    self.info = builder.info
    self.splits = self._dataset.splits
    self.in_file_order = self._dataset.in_file_order  # else TFDS's shuffled order (WMT14)
    self._sources = datasets.check_readable(self._dataset)
    self.tokenizer = tokenizer_lib.load_or_train_tokenizer(
        os.path.join(
            root, "relpos_tokenizers",
            f"{self._dataset.text_name}-{task_config.spm_model_type}-{task_config.vocab_size}-"
            f"seed{task_config.spm_seed}.model"),
        (text for pair in self._pairs("train") for text in pair), vocab_size=task_config.vocab_size,
        model_type=task_config.spm_model_type, seed=task_config.spm_seed)
    _check_vocab_size(self.tokenizer, task_config.vocab_size)

  def _pair_chunks(self, split: str) -> Iterator[list[tuple[str, str]]]:
    """The split's (source, target) texts in stored order, CHUNK pairs at a time."""
    check_split(split, self.name, self.splits)
    source = self._sources[split]
    keys = (self._dataset.source_key, self._dataset.target_key)
    for start in range(0, len(source), CHUNK):
      examples = [source[i] for i in range(start, min(start + CHUNK, len(source)))]
      for i, example in enumerate(examples, start):
        datasets.check_example(self._dataset, split, i, example)
      yield [(_text(e[keys[0]]), _text(e[keys[1]])) for e in examples]

  def _pairs(self, split: str) -> Iterator[tuple[str, str]]:
    return (pair for chunk in self._pair_chunks(split) for pair in chunk)

  def source_texts(self, split: str) -> list[str]:
    """The source sentences of a split, in the split's stored order: its files' line order
    where `in_file_order`, else the order TFDS shuffled it into when it prepared the data."""
    return [source for source, _ in self._pairs(split)]

  def target_texts(self, split: str) -> list[str]:
    """The reference translations of a split, aligned with `source_texts`."""
    return [target for _, target in self._pairs(split)]

  def subsets(self, split: str) -> list[tuple[str, list[int]]]:
    """What a held-out split holds, as (name, indices into its pairs in stored order): the
    synthetic task's `synthetic.subsets_of` (test_long by construction, test by whether a pair
    also occurs in training); none for a task of real data."""
    if self.name != "synthetic":
      return []
    return synthetic.subsets_of(split, list(self._pairs(split)), self._train_pairs)

  @functools.lru_cache(maxsize=None)
  def check_references(self, split: str) -> list[int]:
    """`check_references` of the split's references, warning once per split."""
    return tokenizer_lib.check_references(self.tokenizer, self.target_texts(split),
                                          f"split {split!r} of task {self.name}")

  @functools.cached_property
  def _train_pairs(self) -> frozenset[tuple[str, str]]:
    """The training split's pairs, read once (`subsets` asks for them per split and
    checkpoint)."""
    return frozenset(self._pairs("train"))

  def _tokenize(
      self, split: str, limit: Callable[[list[int], list[int]],
                                        tuple[list[int], list[int]] | None]) -> TokenizedPairs:
    """The split tokenized; `limit(inputs, targets)` rewrites each pair or drops it (None)."""
    tokens, lengths = {k: [] for k in FEATURES}, {k: [] for k in FEATURES}
    for chunk in self._pair_chunks(split):
      chunk_tokens = {k: [] for k in FEATURES}
      encoded = zip(*(self.tokenizer.encode_batch(texts) for texts in zip(*chunk)))
      for pair in filter(None, (limit(*pair) for pair in encoded)):
        for key, ids in zip(FEATURES, pair):
          chunk_tokens[key].extend(ids)
          lengths[key].append(len(ids))
      for key in FEATURES:
        tokens[key].append(np.asarray(chunk_tokens[key], np.int32))
    empty = np.zeros(0, np.int32)
    return TokenizedPairs({k: np.concatenate([empty] + tokens[k]) for k in FEATURES},
                          {k: np.asarray(lengths[k], np.int64) for k in FEATURES})

  @functools.lru_cache(maxsize=None)
  def eval_examples(self, split: str) -> TokenizedPairs:
    """The whole split tokenized, nothing dropped or truncated, in stored order."""
    return self._tokenize(split, lambda inputs, targets: (inputs, targets))

  @functools.lru_cache(maxsize=None)
  def train_examples(self) -> tuple[TokenizedPairs, FilterStats]:
    """Tokenized training examples after the task.max_length limit, and what it did.

    Raises:
      ValueError: no training example fits task.max_length (with overlong="filter").
    """
    max_length, action = self.config.max_length, self.config.overlong
    counts = {"all": 0, "overlong": 0}

    def limit(inputs, targets):
      counts["all"] += 1
      if max(len(inputs), len(targets)) <= max_length:
        return inputs, targets
      counts["overlong"] += 1
      if action == "filter":
        return None
      return _truncate(inputs, max_length), _truncate(targets, max_length)

    examples = self._tokenize("train", limit)
    stats = FilterStats(counts["all"], counts["overlong"], action)
    if stats.num_overlong:  # (a run's start record keeps the counts: `train.train_and_evaluate`)
      logging.warning(
          "Task %s, train split: %d of %d examples (%.1f%%) have more than task.max_length=%d "
          "tokens on a side: %s (task.overlong=%s).", self.name, stats.num_overlong,
          stats.num_examples, 100 * stats.num_overlong / stats.num_examples, max_length,
          "left out" if action == "filter" else "cut to fit, ending with eos", action)
    if not len(examples):
      raise ValueError(f"no training example of task {self.name!r} fits "
                       f"task.max_length={max_length}.")
    return examples, stats

  def train_iterator(self, batch_size: int, *, seed: int, shard_index: int | None = None,
                     shard_count: int | None = None) -> grain.DatasetIterator:
    """An endless iterator over this host's training batches (reshuffled every epoch).

    Packed (task.packing=True): each host shuffles its shard of the examples and packs them
    first-fit into rows of task.max_length tokens: batches [batch_size / shard_count,
    task.max_length]. Unpacked: length bucketing; every host builds the same global batches
    from all examples (windows of batching.BUCKET_WINDOW_BATCHES batches sorted by length)
    and takes its contiguous block of rows (`batching.shard_rows`), so all hosts agree on the
    length and any number of hosts trains on the same global batches: [batch_size /
    shard_count, L], L a multiple of batching.LENGTH_MULTIPLE up to task.max_length.

    Args:
      batch_size: the global batch size (rows), divisible by shard_count.
      seed: shuffling seed, folded with task.shuffle_buffer_seed.
      shard_index, shard_count: this host and the number of hosts (default: JAX's process
        index and count).

    Returns:
      A grain DatasetIterator of batches with the keys of BATCH_KEYS, made TRAIN_PREFETCH_BATCHES
      ahead on a background thread; its get_state() (a small JSON-able dict) is the position
      after the last batch returned, and set_state() resumes exactly.
    """
    shard_index = jax.process_index() if shard_index is None else shard_index
    shard_count = jax.process_count() if shard_count is None else shard_count
    if batch_size % shard_count:
      raise ValueError(f"batch size {batch_size} is not divisible by {shard_count} hosts.")
    if not 0 <= shard_index < shard_count:
      raise ValueError(f"shard_index={shard_index} is not in [0, {shard_count}).")
    examples, _ = self.train_examples()
    seed = int(np.random.SeedSequence([seed, self.config.shuffle_buffer_seed]).generate_state(1)[0])
    source = grain.MapDataset.source(examples)
    concat = self.config.get("concat_probability", 0.0)
    if self.config.packing:
      dataset = batching.packed_batches(source[shard_index::shard_count], batch_size // shard_count,
                                        self.config.max_length, seed, concat)
    else:
      dataset = batching.bucketed_batches(source, batch_size, self.config.max_length, seed,
                                          shard_index, shard_count, concat)
    return iter(
        grain.experimental.ThreadPrefetchIterDataset(dataset,
                                                     prefetch_buffer_size=TRAIN_PREFETCH_BATCHES))

  def eval_batches(self, split: str, batch_size: int,
                   max_len: int | None = None) -> Iterator[dict[str, np.ndarray]]:
    """The whole split in stored order: nothing dropped or truncated, unpacked.

    Args:
      split: a split of the task.
      batch_size: rows per batch.
      max_len: model.max_len: a batch whose sentences fit it is padded no further (a learned
        absolute table has no position beyond it).

    Yields:
      Batches [batch_size, L] with the keys of BATCH_KEYS, L the batch's longest side rounded
      up to a multiple of batching.LENGTH_MULTIPLE (at most `max_len` where that fits), plus
      "example_index" int32 [batch_size]: the row's index in the split, -1 on the filler rows
      of the last batch (all padding).
    """
    examples = self.eval_examples(split)
    for start in range(0, len(examples), batch_size):
      index = np.arange(start, min(start + batch_size, len(examples)))
      batch = batching.pad_rows([examples[i] for i in index], batch_size, max_len)
      batch["example_index"] = np.full((batch_size,), -1, np.int32)
      batch["example_index"][:len(index)] = index
      yield batch


def _truncate(ids: list[int], max_length: int) -> list[int]:
  """`ids` if it fits, else its first max_length - 1 ids and EOS_ID."""
  return ids if len(ids) <= max_length else ids[:max_length - 1] + [tokenizer_lib.EOS_ID]


@functools.lru_cache(maxsize=8)
def _cached_task(frozen: ml_collections.FrozenConfigDict) -> Task:
  return Task(ml_collections.ConfigDict(frozen))


def get_task(task_config: ml_collections.ConfigDict) -> Task:
  """The Task of `task_config` (config.task); one instance per distinct config per process."""
  return _cached_task(ml_collections.FrozenConfigDict(task_config))
