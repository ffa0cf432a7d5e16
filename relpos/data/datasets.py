"""What the TFDS builders of relpos share: the data dir, pair features, preparing safely.

Every dataset is prepared once in the `array_record` file format and read back with
`builder.as_data_source` (random access, no TensorFlow). TFDS writes a dataset into a temporary
`incomplete.*` folder and renames it only when every split is written; `prepare` also removes
the empty folders a failed build leaves, so nothing that looks like a dataset stays behind.
"""

import dataclasses
import glob
import json
import os
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

import jax
import ml_collections
import tensorflow_datasets as tfds
from jax.experimental import multihost_utils
from google.protobuf import json_format

FILE_FORMAT = "array_record"
SOURCE_KEY = "source"
TARGET_KEY = "target"


@dataclasses.dataclass(frozen=True)
class PairDataset:
  """A prepared TFDS dataset of translation pairs.

  Attributes:
    builder: the prepared builder (`builder.info` holds the metadata).
    splits: the split names, in a fixed order.
    source_key, target_key: the text features of the source and the target sentence.
  """
  builder: tfds.core.DatasetBuilder
  splits: tuple[str, ...]
  source_key: str = SOURCE_KEY
  target_key: str = TARGET_KEY

  @property
  def in_file_order(self) -> bool:
    """Whether each split is stored in its source files' line order: relpos's own builders
    store it so (`pair_info`); TFDS shuffles a builder's examples by key unless told not to,
    as it does the catalog's `wmt14_translate`."""
    return bool(self.builder.info.disable_shuffling)

  @property
  def text_name(self) -> str:
    """Names the text a tokenizer of this dataset trains on: builder, builder config, version,
    and the direction where the config holds both (the catalog's `wmt14_translate/de-en` keys
    its languages, and the training text interleaves source and target in that order)."""
    builder = self.builder
    keys_name_no_direction = (self.source_key, self.target_key) == (SOURCE_KEY, TARGET_KEY)
    direction = "" if keys_name_no_direction else f"-{self.source_key}_to_{self.target_key}"
    return f"{builder.name}-{builder.builder_config.name}{direction}-{builder.version}"

  def data_sources(self) -> dict[str, Sequence[dict[str, bytes]]]:
    """Split name -> random-access data source of decoded examples."""
    return self.builder.as_data_source(split={split: split for split in self.splits})


def data_dir(task_config: ml_collections.ConfigDict) -> str:
  """task.tfds_data_dir, else $RELPOS_DATA_DIR, else ~/tensorflow_datasets."""
  return os.path.expanduser(task_config.tfds_data_dir or
                            os.environ.get("RELPOS_DATA_DIR", "~/tensorflow_datasets"))


def pair_info(builder: tfds.core.DatasetBuilder, description: str,
              **kwargs) -> tfds.core.DatasetInfo:
  """DatasetInfo of text pairs {"source", "target"} stored in generation order.

  Args:
    builder: the builder the info describes.
    description: what the dataset is.
    **kwargs: more DatasetInfo arguments (homepage, metadata, ...).
  """
  return tfds.core.DatasetInfo(
      builder=builder, description=description, features=tfds.features.FeaturesDict(
          {SOURCE_KEY: tfds.features.Text(), TARGET_KEY: tfds.features.Text()}),
      supervised_keys=(SOURCE_KEY, TARGET_KEY), disable_shuffling=True, **kwargs)


class PairBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Base of the builders of sentence pairs: `_split_generators` returns, per split,
  `self._generate_examples(pairs)` for its (source, target) pairs."""
  def _generate_examples(self, pairs: Sequence[tuple[str,
                                                     str]]) -> Iterator[tuple[int, dict[str, str]]]:
    for i, (source, target) in enumerate(pairs):
      yield i, {SOURCE_KEY: source, TARGET_KEY: target}


Builder = TypeVar("Builder", bound=tfds.core.DatasetBuilder)


def prepared(make_builder: Callable[[], Builder], prepare_data: Callable[[Builder],
                                                                         None]) -> Builder:
  """A builder whose data is prepared: `prepare_data(builder)` (a download, then `prepare`)
  runs unless the data is there.

  Under several processes, process 0 prepares first while the others wait, then each of them
  opens the builder again and prepares only where its host still lacks the data (a data folder
  of its own): on a shared folder they find it prepared, where all raced to write it (TFDS's
  final rename fails for all but one, and the others waited in their first collective). When
  process 0 fails, it raises once the others stopped waiting, and they try for themselves.
  """
  builder = make_builder()
  failure = None
  if jax.process_index() == 0 and not builder.is_prepared():
    try:
      prepare_data(builder)
    except Exception as e:  # pylint: disable=broad-exception-caught
      if jax.process_count() == 1:
        raise
      failure = e
  if jax.process_count() == 1:
    return builder
  multihost_utils.sync_global_devices(f"relpos: {builder.name} prepared")
  if failure is not None:
    raise failure
  if jax.process_index() != 0:
    builder = make_builder()  # its info as process 0 wrote it
    if not builder.is_prepared():
      prepare_data(builder)
  return builder


def prepare(builder: tfds.core.DatasetBuilder) -> None:
  """Writes the dataset unless it is there; a failed build leaves no folder behind it."""
  try:
    builder.download_and_prepare(file_format=FILE_FORMAT)
  except BaseException:
    _remove_empty_parents(builder.data_dir, os.path.abspath(builder.data_dir_root))
    raise


def _remove_empty_parents(path: str, root: str) -> None:
  """Removes `path` (if there) and its parents below `root` up to the first non-empty one."""
  path = os.path.abspath(path)
  while path.startswith(root + os.sep):
    if os.path.isdir(path):
      if os.listdir(path):
        return
      os.rmdir(path)
    path = os.path.dirname(path)


# What reading a damaged prepared dataset raises: a missing or truncated array_record shard
# (RuntimeError from its C++ reader, OSError), a garbage dataset_info.json (protobuf's JSON
# parser) or features.json (json).
DAMAGE_ERRORS = (RuntimeError, OSError, json_format.Error, json.JSONDecodeError)


class DamagedDataError(ValueError):
  """A prepared dataset folder that cannot be read."""


def damaged(folder: str, error: BaseException) -> DamagedDataError:
  """The error for a prepared dataset `folder` that cannot be read: one line naming it, the
  cause and how to prepare it again."""
  cause = (str(error).strip().splitlines() or [type(error).__name__])[0]
  return DamagedDataError(
      f"prepared data in {folder} is damaged ({cause}): move it aside (mv {folder} "
      f"{folder}.damaged) and run again to prepare it again.")


def unreadable_info_folders(root: str) -> list[str]:
  """The dataset folders under `root` (<name>/<config>/<version>) whose dataset_info.json is
  not JSON."""
  folders = []
  for path in sorted(glob.glob(os.path.join(root, "*", "*", "*", "dataset_info.json"))):
    try:
      with open(path, encoding="utf-8") as f:
        json.load(f)
    except (OSError, ValueError):
      folders.append(os.path.dirname(path))
  return folders


def check_readable(dataset: PairDataset) -> dict[str, Sequence[dict[str, bytes]]]:
  """The data sources of `dataset` (`PairDataset.data_sources`), after reading the first and
  the last example of every split: a missing or truncated shard fails here, before any work.

  Raises:
    DamagedDataError: naming the dataset's folder and how to prepare it again.
  """
  try:
    sources = dataset.data_sources()
    for split, source in sources.items():
      for index in sorted({0, len(source) - 1}) if len(source) else ():
        check_example(dataset, split, index, source[index])
  except DAMAGE_ERRORS as e:
    raise damaged(dataset.builder.data_dir, e) from None
  return sources


def check_example(dataset: PairDataset, split: str, index: int,
                  example: dict[str, bytes | None]) -> None:
  """Refuses an example whose text is missing: what a truncated shard reads as (no error).

  Raises:
    DamagedDataError: naming the dataset's folder, the split and the example.
  """
  for key in (dataset.source_key, dataset.target_key):
    if example.get(key) is None:
      raise damaged(
          dataset.builder.data_dir,
          OSError(f"example {index} of split {split!r} has no {key} text: a truncated shard"))
