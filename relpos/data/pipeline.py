"""The input pipeline: TFDS array_record data -> SentencePiece -> grain batches.

`get_task(config.task)` prepares the task's TFDS dataset (once, in the TFDS data dir), its
tokenizer (trained on the train split on first use, cached beside the data) and returns a
`Task`. TensorFlow is not needed: data is read with `builder.as_data_source()` and grain.

Batches are dicts of int32 arrays [batch, length] with the keys of BATCH_KEYS:
"inputs", "targets" (token ids, PAD_ID padded), "inputs_position", "targets_position"
(0-based, restarting per packed segment, 0 on padding), "inputs_segmentation",
"targets_segmentation" (segment id 1, 2, ... per packed example, 0 on padding).
"""

import dataclasses
import functools
import os
from collections.abc import Iterator

import grain
import ml_collections
import numpy as np
import tensorflow_datasets as tfds
from absl import logging

from relpos.data import multi30k
from relpos.data import synthetic
from relpos.data import tokenizer as tokenizer_lib

BATCH_KEYS = ("inputs", "targets", "inputs_position", "targets_position",
              "inputs_segmentation", "targets_segmentation")
# Evaluation batches are padded to a multiple of this length (few shapes to compile).
EVAL_LENGTH_MULTIPLE = 16
WMT14_LANGUAGES = ("de", "en")


def data_dir(task_config: ml_collections.ConfigDict) -> str:
  """task.tfds_data_dir, else $RELPOS_DATA_DIR, else ~/tensorflow_datasets."""
  return os.path.expanduser(task_config.tfds_data_dir or os.environ.get(
      "RELPOS_DATA_DIR", "~/tensorflow_datasets"))


def _synthetic_builder(task_config, root: str) -> tfds.core.DatasetBuilder:
  params = synthetic.SyntheticParams(**task_config.synthetic.to_dict())
  return synthetic.SyntheticTranslation(config=synthetic.SyntheticBuilderConfig(params),
                                        data_dir=root, file_format="array_record")


def _multi30k_builder(task_config, root: str) -> tfds.core.DatasetBuilder:
  source, target = task_config.source_lang, task_config.target_lang
  multi30k.check_language("task.source_lang", source)
  multi30k.check_language("task.target_lang", target)
  raw_dir = task_config.manual_dir or multi30k.download(
      task_config.download_url or multi30k.DEFAULT_URL,
      os.path.join(root, "downloads", "multi30k"), (source, target))
  builder = multi30k.Multi30k(config=multi30k.Multi30kConfig(source, target, raw_dir),
                              data_dir=root, file_format="array_record")
  if not builder.is_prepared():
    for split in multi30k.available_splits(raw_dir, source, target):  # fail before writing
      multi30k.read_split(raw_dir, multi30k.SPLIT_STEMS[split], source, target)
  return builder


def _wmt14_builder(task_config, root: str) -> tfds.core.DatasetBuilder:
  for field in ("source_lang", "target_lang"):
    if task_config[field] not in WMT14_LANGUAGES:
      raise ValueError(f"config field task.{field}={task_config[field]!r} is invalid: WMT14 "
                       f"(wmt14_translate/de-en) has {', '.join(WMT14_LANGUAGES)}.")
  return tfds.builder("wmt14_translate/de-en", data_dir=root, file_format="array_record")


_BUILDERS = {"synthetic": _synthetic_builder, "multi30k": _multi30k_builder,
             "wmt14": _wmt14_builder}


def _text(value) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


@dataclasses.dataclass
class FilterStats:
  """What the length limit did to the training examples."""
  num_examples: int
  num_overlong: int
  action: str  # "filter" (dropped) or "truncate"


class Task:
  """A prepared translation task: its splits, texts, tokenizer and batch iterators."""

  def __init__(self, task_config: ml_collections.ConfigDict):
    """Prepares the TFDS dataset and the tokenizer of `task_config` (config.task).

    Raises:
      ValueError: an unknown task or language, or bad data files (named).
      FileNotFoundError: missing data files (named).
    """
    if task_config.name not in _BUILDERS:
      raise ValueError(f"config field task.name={task_config.name!r} is invalid: must be one "
                       f"of {', '.join(_BUILDERS)}.")
    self.name = task_config.name
    self.config = task_config
    root = data_dir(task_config)
    builder = _BUILDERS[task_config.name](task_config, root)
    builder.download_and_prepare(file_format="array_record")
    self.info = builder.info
    self._sources = builder.as_data_source()
    self.splits = tuple(self._sources)
    if self.name == "wmt14":
      self._keys = (task_config.source_lang, task_config.target_lang)
    else:
      self._keys = ("source", "target")
    self.tokenizer = tokenizer_lib.load_or_train_tokenizer(
        os.path.join(root, "relpos_tokenizers",
                     f"{builder.name}-{builder.builder_config.name}-{'-'.join(self._keys)}-"
                     f"{task_config.spm_model_type}{task_config.vocab_size}"
                     f"-s{task_config.spm_seed}.model"),
        (text for split_text in (self.source_texts("train"), self.target_texts("train"))
         for text in split_text),
        vocab_size=task_config.vocab_size, model_type=task_config.spm_model_type,
        seed=task_config.spm_seed)

  def _check_split(self, split: str) -> None:
    if split not in self._sources:
      raise ValueError(f"split {split!r} is not a split of task {self.name!r}; allowed: "
                       f"{', '.join(self.splits)}.")

  @functools.lru_cache(maxsize=None)
  def _texts(self, split: str) -> tuple[list[str], list[str]]:
    self._check_split(split)
    source = self._sources[split]
    examples = [source[i] for i in range(len(source))]
    return ([_text(e[self._keys[0]]) for e in examples],
            [_text(e[self._keys[1]]) for e in examples])

  def source_texts(self, split: str) -> list[str]:
    """The source sentences of a split, in the split's stored order."""
    return self._texts(split)[0]

  def target_texts(self, split: str) -> list[str]:
    """The reference translations of a split, aligned with `source_texts`."""
    return self._texts(split)[1]

  def _tokenized(self, split: str) -> list[tuple[np.ndarray, np.ndarray]]:
    encode = lambda t: np.asarray(self.tokenizer.encode(t), np.int32)
    return [(encode(s), encode(t)) for s, t in zip(self.source_texts(split),
                                                   self.target_texts(split))]

  @functools.lru_cache(maxsize=None)
  def train_examples(self) -> tuple[list[dict[str, np.ndarray]], FilterStats]:
    """Tokenized training examples after the length limit, and what the limit did."""
    max_length, action = self.config.max_length, self.config.overlong
    examples, overlong = [], 0
    for inputs, targets in self._tokenized("train"):
      if len(inputs) > max_length or len(targets) > max_length:
        overlong += 1
        if action == "filter":
          continue
        inputs, targets = _truncate(inputs, max_length), _truncate(targets, max_length)
      examples.append({"inputs": inputs, "targets": targets})
    stats = FilterStats(len(examples) + (overlong if action == "filter" else 0), overlong,
                        action)
    logging.info("Task %s train split: %d of %d examples longer than %d tokens (%s).",
                 self.name, overlong, stats.num_examples, max_length, action)
    if not examples:
      raise ValueError(f"no training example fits task.max_length={max_length}.")
    return examples, stats

  def train_iterator(self, batch_size: int, *, seed: int, shard_index: int = 0,
                     shard_count: int = 1) -> grain.DatasetIterator:
    """An endless iterator of training batches of this host's shard.

    Args:
      batch_size: the global batch size; each host gets batch_size / shard_count rows.
      seed: shuffling seed (a new order every epoch).
      shard_index, shard_count: this host's shard of the examples.

    Returns:
      A grain DatasetIterator (get_state / set_state resume it exactly) of batches
      [batch_size / shard_count, task.max_length] with the keys of BATCH_KEYS.
    """
    if batch_size % shard_count:
      raise ValueError(f"batch size {batch_size} is not divisible by {shard_count} hosts.")
    examples, _ = self.train_examples()
    stream = (grain.MapDataset.source(examples)[shard_index::shard_count]
              .seed(seed + 1000003 * self.config.shuffle_buffer_seed).shuffle().repeat())
    return BatchIterator(stream, batch_size // shard_count, self.config.max_length,
                         pack=self.config.packing)

  def eval_batches(self, split: str, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
    """The whole split in order, nothing dropped or truncated, unpacked.

    Yields:
      Batches with the keys of BATCH_KEYS plus "example_index" int32 [batch] (the example's
      index in the split, -1 on the filler rows of the last batch, which are all padding);
      lengths padded to a multiple of EVAL_LENGTH_MULTIPLE.
    """
    examples = self._tokenized(split)
    for start in range(0, len(examples), batch_size):
      rows = examples[start:start + batch_size]
      longest = max(max(len(s), len(t)) for s, t in rows)
      length = -(-longest // EVAL_LENGTH_MULTIPLE) * EVAL_LENGTH_MULTIPLE
      padded = [_pad_example({"inputs": s, "targets": t}, length=length) for s, t in rows]
      batch = {k: np.zeros((batch_size, length), np.int32) for k in BATCH_KEYS}
      for key in BATCH_KEYS:
        batch[key][:len(rows)] = np.stack([p[key] for p in padded])
      batch["example_index"] = np.full((batch_size,), -1, np.int32)
      batch["example_index"][:len(rows)] = np.arange(start, start + len(rows))
      yield batch


def _truncate(tokens: np.ndarray, max_length: int) -> np.ndarray:
  """The first max_length tokens, still ending with EOS."""
  return np.concatenate([tokens[:max_length - 1], [tokenizer_lib.EOS_ID]]).astype(np.int32)


def _pad_example(example: dict[str, np.ndarray], *, length: int) -> dict[str, np.ndarray]:
  """One unpacked example padded to `length`, with positions and segment id 1."""
  out = {}
  for key in ("inputs", "targets"):
    tokens = example[key]
    out[key] = np.zeros(length, np.int32)
    out[key][:len(tokens)] = tokens
    out[f"{key}_position"] = np.zeros(length, np.int32)
    out[f"{key}_position"][:len(tokens)] = np.arange(len(tokens))
    out[f"{key}_segmentation"] = (out[key] != tokenizer_lib.PAD_ID).astype(np.int32)
  return out


class BatchIterator(grain.DatasetIterator):
  """Training batches read in order from an endless, shuffled grain MapDataset of examples.

  Packed (first-fit): examples are taken in stream order, each into the first row with room
  for both its source and its target; the first example that fits in no row closes the batch
  and opens the next one, so no example is split, dropped or reordered across batches.
  Unpacked: `batch` examples a batch, one per row, padded to the smallest multiple of
  EVAL_LENGTH_MULTIPLE that holds the batch's longest (length bucketing: few shapes).

  The state is the stream position of the next batch's first example, so `set_state`
  resumes exactly and the state is a small JSON dict (saved with each checkpoint).
  """

  def __init__(self, stream: grain.MapDataset, batch: int, length: int, *, pack: bool):
    super().__init__()
    self._stream, self._batch, self._length, self._pack = stream, batch, length, pack
    self._position = 0

  def get_state(self) -> dict[str, int]:
    return {"position": self._position}

  def set_state(self, state: dict[str, int]) -> None:
    self._position = int(state["position"])

  def __next__(self) -> dict[str, np.ndarray]:
    if not self._pack:
      rows = [self._stream[self._position + i] for i in range(self._batch)]
      self._position += self._batch
      longest = max(max(len(r["inputs"]), len(r["targets"])) for r in rows)
      length = min(self._length, -(-longest // EVAL_LENGTH_MULTIPLE) * EVAL_LENGTH_MULTIPLE)
      padded = [_pad_example(r, length=length) for r in rows]
      return {k: np.stack([p[k] for p in padded]) for k in BATCH_KEYS}
    batch = {k: np.zeros((self._batch, self._length), np.int32) for k in BATCH_KEYS}
    used = {key: np.zeros(self._batch, np.int64) for key in ("inputs", "targets")}
    segments = np.zeros(self._batch, np.int32)
    while True:
      example = self._stream[self._position]
      fits = np.flatnonzero((used["inputs"] + len(example["inputs"]) <= self._length)
                            & (used["targets"] + len(example["targets"]) <= self._length))
      if not fits.size:
        return batch
      row = fits[0]
      segments[row] += 1
      for key in ("inputs", "targets"):
        tokens, start = example[key], used[key][row]
        end = start + len(tokens)
        batch[key][row, start:end] = tokens
        batch[f"{key}_position"][row, start:end] = np.arange(len(tokens))
        batch[f"{key}_segmentation"][row, start:end] = segments[row]
        used[key][row] = end
      self._position += 1


@functools.lru_cache(maxsize=8)
def _cached_task(frozen: ml_collections.FrozenConfigDict) -> Task:
  return Task(ml_collections.ConfigDict(frozen))


def get_task(task_config: ml_collections.ConfigDict) -> Task:
  """The Task of `task_config` (config.task); one instance per distinct config per process."""
  return _cached_task(ml_collections.FrozenConfigDict(task_config))
