"""Multi30K (task 1) as a TFDS builder, from raw `.gz` files in a folder or downloaded.

The raw files (`<stem>.<lang>.gz`, one cased sentence a line, line N of each language
aligned) come from a local folder (`task.manual_dir`, e.g. `../shared/data/multi30k`) or,
where a network is available, are downloaded from the public Multi30K repository
(`task.download_url`, default DEFAULT_URL) into `<tfds data dir>/downloads/multi30k`.

Every file is read and checked before any example is written: a missing or empty file, text
that is not UTF-8, or source and target files with different line counts raise an error naming
the file, and the failed build leaves no dataset folder.

The prepared data records the sha256 of the text of each raw file it was read from (`info.metadata`,
RAW_SHA256_KEY, from 28 November 2026); a later load from a `task.manual_dir` where one of them
has changed is refused, naming the file (the prepared copy would otherwise be read in silence).
"""

import gzip
import hashlib
import os
import urllib.error
import urllib.request

import ml_collections
import tensorflow_datasets as tfds
from absl import logging

from relpos import json_files
from relpos.data import datasets

LANGUAGES = ("en", "de", "fr", "cs")
DEFAULT_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"
# Split name -> file stem; the first three are required, the others used when present.
SPLIT_STEMS = {
    "train": "train", "validation": "val", "test_2016_flickr": "test_2016_flickr",
    "test_2017_flickr": "test_2017_flickr", "test_2017_mscoco": "test_2017_mscoco"
}
REQUIRED_SPLITS = ("train", "validation", "test_2016_flickr")
DOWNLOAD_TIMEOUT_S = 60
# In the prepared data's metadata: {raw file name: `text_sha256`} of the files it was read from.
RAW_SHA256_KEY = "raw_files_sha256"


def check_languages(source_lang: str, target_lang: str) -> None:
  """Raises ValueError unless both are Multi30K languages and they differ."""
  for field, code in (("task.source_lang", source_lang), ("task.target_lang", target_lang)):
    if code not in LANGUAGES:
      raise ValueError(f"config field {field}={code!r} is invalid: Multi30K languages are "
                       f"{', '.join(LANGUAGES)}.")
  if source_lang == target_lang:
    raise ValueError(f"config fields task.source_lang and task.target_lang are both "
                     f"{source_lang!r}: a translation needs two languages.")


def read_lines(path: str) -> list[str]:
  """The lines of a gzip-compressed UTF-8 text file, without their line ends.

  Raises:
    FileNotFoundError: no such file.
    ValueError: the file is not gzip, not UTF-8, or holds no sentence.
  """
  if not os.path.exists(path):
    raise FileNotFoundError(f"Multi30K file {path} does not exist.")
  try:
    with gzip.open(path, "rb") as f:
      data = f.read()
  except (OSError, EOFError) as e:
    raise ValueError(f"Multi30K file {path} is not a readable gzip file: {e}") from e
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise ValueError(f"Multi30K file {path} is not UTF-8 text (byte {e.start}).") from e
  lines = [line.rstrip("\r") for line in text.removesuffix("\n").split("\n")]
  if not any(line.strip() for line in lines):
    raise ValueError(f"Multi30K file {path} is empty.")
  return lines


def text_sha256(path: str) -> str:
  """The hex sha256 of a gzip file's text (compressed again, or copied, it is the same); "" when
  it cannot be read (it is not the file that was read)."""
  try:
    with gzip.open(path, "rb") as f:
      return hashlib.sha256(f.read()).hexdigest()
  except (OSError, EOFError):
    return ""


def read_split(directory: str, stem: str, source_lang: str,
               target_lang: str) -> list[tuple[str, str]]:
  """Aligned (source, target) pairs of one split.

  Raises:
    FileNotFoundError, ValueError: see `read_lines`; ValueError for unequal line counts.
  """
  source_path = os.path.join(directory, f"{stem}.{source_lang}.gz")
  target_path = os.path.join(directory, f"{stem}.{target_lang}.gz")
  sources, targets = read_lines(source_path), read_lines(target_path)
  if len(sources) != len(targets):
    raise ValueError(f"Multi30K files {source_path} ({len(sources)} lines) and {target_path} "
                     f"({len(targets)} lines) differ in length: line N must translate line N.")
  return list(zip(sources, targets))


def available_splits(directory: str, source_lang: str, target_lang: str) -> list[str]:
  """The required splits plus the optional ones whose two files are in `directory`."""
  return [
      split for split, stem in SPLIT_STEMS.items() if split in REQUIRED_SPLITS or all(
          os.path.exists(os.path.join(directory, f"{stem}.{lang}.gz"))
          for lang in (source_lang, target_lang))
  ]


def download(url_base: str, directory: str, languages: tuple[str, str]) -> str:
  """Downloads the raw files of `languages` missing from `directory` (each written atomically).

  Optional test sets the server does not have (HTTP 404) are skipped.

  Returns:
    `directory`.

  Raises:
    FileNotFoundError: a required file could not be downloaded, or an optional one failed
      otherwise than by being absent (the URL is named).
  """
  os.makedirs(directory, exist_ok=True)
  for split, stem in SPLIT_STEMS.items():
    for lang in languages:
      name = f"{stem}.{lang}.gz"
      path = os.path.join(directory, name)
      if os.path.exists(path):
        continue
      url = url_base.rstrip("/") + "/" + name
      try:
        with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response:
          data = response.read()
      except OSError as e:  # urllib.error.URLError and HTTPError are OSErrors
        absent = isinstance(e, urllib.error.HTTPError) and e.code == 404
        if absent and split not in REQUIRED_SPLITS:
          logging.info("Multi30K: %s is not on the server; split %s is left out.", url, split)
          continue
        raise FileNotFoundError(f"could not download Multi30K file {url}: {e}") from e
      json_files.write_bytes(path, data)
  return directory


class Multi30kConfig(tfds.core.BuilderConfig):
  """One language pair (the builder config's name, e.g. "en-de")."""
  def __init__(self, source_lang: str = "en", target_lang: str = "de"):
    check_languages(source_lang, target_lang)
    super().__init__(name=f"{source_lang}-{target_lang}",
                     description=f"Multi30K {source_lang} to {target_lang}")
    self.source_lang, self.target_lang = source_lang, target_lang


class Multi30k(datasets.PairBuilder):
  """Multi30K task 1; features {"source", "target"} (text), splits in file order."""

  VERSION = tfds.core.Version("1.0.0")

  def __init__(self, *, raw_dir: str = "", **kwargs):
    """Args: raw_dir: the folder of raw `.gz` files (read when preparing); kwargs: TFDS's."""
    super().__init__(**kwargs)
    self._raw_dir = raw_dir

  def _info(self) -> tfds.core.DatasetInfo:
    return datasets.pair_info(self, __doc__, homepage="https://github.com/multi30k/dataset",
                              metadata=tfds.core.MetadataDict())

  def _split_generators(self, dl_manager):
    del dl_manager  # files come from raw_dir (see `download`)
    config = self.builder_config
    languages = (config.source_lang, config.target_lang)
    names = available_splits(self._raw_dir, *languages)
    splits = {split: read_split(self._raw_dir, SPLIT_STEMS[split], *languages) for split in names}
    self.info.metadata[RAW_SHA256_KEY] = {
        file: text_sha256(os.path.join(self._raw_dir, file))
        for file in (f"{SPLIT_STEMS[split]}.{lang}.gz" for split in names for lang in languages)
    }
    return {split: self._generate_examples(pairs) for split, pairs in splits.items()}


def check_unchanged(builder: Multi30k, manual_dir: str) -> None:
  """Refuses prepared data whose raw files in `manual_dir` have changed since (`text_sha256`);
  data prepared before the record was kept, and a file no longer there, are not checked.

  Raises:
    ValueError: naming the changed file and the prepared folder.
  """
  metadata = builder.info.metadata  # read from its file by items() (not by get or len)
  recorded = dict(metadata.items()).get(RAW_SHA256_KEY, {}) if metadata is not None else {}
  for name, sha256 in sorted(recorded.items()):
    path = os.path.join(manual_dir, name)
    if os.path.isfile(path) and text_sha256(path) != sha256:
      raise ValueError(f"task.manual_dir file {path} has changed since the Multi30K in "
                       f"{builder.data_dir} was prepared from it: move that folder aside to "
                       "prepare it again from the files as they are, or restore the file.")


def load(task_config: ml_collections.ConfigDict, root: str) -> datasets.PairDataset:
  """Multi30K for task.source_lang -> task.target_lang, prepared into `root` on first use.

  The raw files come from task.manual_dir, else are downloaded from task.download_url (or
  DEFAULT_URL) unless the dataset is already prepared.

  Raises:
    ValueError: an unknown language, a bad file, or a file of task.manual_dir changed since the
      data was prepared from it (named).
    FileNotFoundError: a missing file or a failed download (named).
  """
  source, target = task_config.source_lang, task_config.target_lang
  manual_dir = os.path.expanduser(task_config.manual_dir or "")  # (a shell leaves "=~/x" be)
  raw_dir = manual_dir or os.path.join(root, "downloads", "multi30k")

  def download_and_prepare(builder: Multi30k) -> None:
    if not manual_dir:
      download(task_config.download_url or DEFAULT_URL, raw_dir, (source, target))
    datasets.prepare(builder)

  builder = datasets.prepared(
      lambda: Multi30k(raw_dir=raw_dir, config=Multi30kConfig(source, target), data_dir=root,
                       file_format=datasets.FILE_FORMAT), download_and_prepare)
  if manual_dir and not os.path.isdir(manual_dir):  # read only to prepare the data
    logging.warning("task.manual_dir %s does not exist: using the Multi30K prepared in %s.",
                    manual_dir, builder.data_dir)
  elif manual_dir:
    check_unchanged(builder, manual_dir)
  splits = tuple(split for split in SPLIT_STEMS if split in builder.info.splits)
  return datasets.PairDataset(builder, splits)
