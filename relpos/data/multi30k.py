"""Multi30K (task 1) as a TFDS builder, from raw `.gz` files in a folder or downloaded.

The raw files (`<stem>.<lang>.gz`, one cased sentence a line, line N of each language
aligned) come from a local folder (`task.manual_dir`, e.g. `../shared/data/multi30k`) or,
where a network is available, are downloaded from the public Multi30K repository
(`task.download_url`, default DEFAULT_URL) into `<tfds data dir>/downloads/multi30k`.

Every file is checked before anything is written: a missing or empty file, text that is not
UTF-8, or source and target files with different line counts raise an error naming the file.
"""

import gzip
import os
import urllib.error
import urllib.request

import tensorflow_datasets as tfds

LANGUAGES = ("en", "de", "fr", "cs")
DEFAULT_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"
# Split name -> file stem; the first three are required, the others used when present.
SPLIT_STEMS = {"train": "train", "validation": "val", "test_2016_flickr": "test_2016_flickr",
               "test_2017_flickr": "test_2017_flickr", "test_2017_mscoco": "test_2017_mscoco"}
REQUIRED_SPLITS = ("train", "validation", "test_2016_flickr")


def check_language(field: str, code: str) -> None:
  """Raises ValueError unless `code` is a Multi30K language."""
  if code not in LANGUAGES:
    raise ValueError(f"config field {field}={code!r} is invalid: Multi30K languages are "
                     f"{', '.join(LANGUAGES)}.")


def read_lines(path: str) -> list[str]:
  """The lines of a gzip-compressed UTF-8 text file, without their newlines.

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
  lines = text.splitlines()
  if not any(line.strip() for line in lines):
    raise ValueError(f"Multi30K file {path} is empty.")
  return lines


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
  return [split for split, stem in SPLIT_STEMS.items()
          if split in REQUIRED_SPLITS or all(
              os.path.exists(os.path.join(directory, f"{stem}.{lang}.gz"))
              for lang in (source_lang, target_lang))]


def download(url_base: str, directory: str, languages: tuple[str, str]) -> str:
  """Downloads the raw files of `languages` into `directory` (each written atomically).

  Required files that fail to download raise; optional test sets that are absent are skipped.

  Returns:
    `directory`.
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
        with urllib.request.urlopen(url, timeout=60) as response:
          data = response.read()
      except urllib.error.URLError as e:
        if split in REQUIRED_SPLITS:
          raise FileNotFoundError(f"could not download Multi30K file {url}: {e}") from e
        continue
      tmp = f"{path}.tmp{os.getpid()}"
      with open(tmp, "wb") as f:
        f.write(data)
      os.replace(tmp, path)
  return directory


class Multi30kConfig(tfds.core.BuilderConfig):
  """One language pair, read from `raw_dir` (not part of the dataset's identity)."""

  def __init__(self, source_lang: str = "en", target_lang: str = "de", raw_dir: str = ""):
    check_language("task.source_lang", source_lang)
    check_language("task.target_lang", target_lang)
    if source_lang == target_lang:
      raise ValueError(f"config fields task.source_lang and task.target_lang are both "
                       f"{source_lang!r}: a translation needs two languages.")
    super().__init__(name=f"{source_lang}-{target_lang}",
                     description=f"Multi30K {source_lang} to {target_lang}")
    self.source_lang, self.target_lang, self.raw_dir = source_lang, target_lang, raw_dir


class Multi30k(tfds.core.GeneratorBasedBuilder):
  """Multi30K task 1; features {"source", "target"} (text)."""

  VERSION = tfds.core.Version("1.0.0")

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self, description=__doc__,
        features=tfds.features.FeaturesDict({"source": tfds.features.Text(),
                                             "target": tfds.features.Text()}),
        supervised_keys=("source", "target"),
        homepage="https://github.com/multi30k/dataset")

  def _split_generators(self, dl_manager):
    del dl_manager  # files come from raw_dir (see `download`)
    config = self.builder_config
    return {split: self._generate_examples(
        read_split(config.raw_dir, SPLIT_STEMS[split], config.source_lang, config.target_lang))
            for split in available_splits(config.raw_dir, config.source_lang,
                                          config.target_lang)}

  def _generate_examples(self, pairs: list[tuple[str, str]]):
    for i, (source, target) in enumerate(pairs):
      yield i, {"source": source, "target": target}
