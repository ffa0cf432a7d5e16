"""Tests for relpos.data.datasets: where data is prepared, preparing a builder of pairs safely
(a failed build leaves no folder), and reading it back, refusing a damaged copy in one line.
(Damaged shards and dataset_info.json read through a task: test_data_pipeline.py.)"""

import os

import pytest
import tensorflow_datasets as tfds

from configs import default
from relpos.data import datasets

PAIRS = {"train": [("a b", "x y"), ("c", "z")], "test": [("d e f", "u v w")]}


class TinyPairs(datasets.PairBuilder):
  """Two splits of fixed pairs; `fail_after` > 0 raises after that many train examples."""
  VERSION = tfds.core.Version("1.0.0")
  fail_after = 0

  def _info(self) -> tfds.core.DatasetInfo:
    return datasets.pair_info(self, "pairs for a test")

  def _split_generators(self, dl_manager):
    del dl_manager
    return {split: self._pairs(split) for split in PAIRS}

  def _pairs(self, split):
    for i, example in self._generate_examples(PAIRS[split]):
      if self.fail_after and i >= self.fail_after:
        raise RuntimeError("the source went away")
      yield i, example


def _prepared(root) -> datasets.PairDataset:
  builder = TinyPairs(data_dir=str(root), file_format=datasets.FILE_FORMAT)
  datasets.prepare(builder)
  return datasets.PairDataset(builder, ("train", "test"))


def test_data_dir_resolution(monkeypatch, tmp_path):
  config = default.get_config().task
  monkeypatch.setenv("RELPOS_DATA_DIR", str(tmp_path / "env"))
  assert datasets.data_dir(config) == str(tmp_path / "env")
  config.tfds_data_dir = str(tmp_path / "field")
  assert datasets.data_dir(config) == str(tmp_path / "field")
  monkeypatch.delenv("RELPOS_DATA_DIR")
  monkeypatch.setenv("HOME", str(tmp_path))
  assert datasets.data_dir(default.get_config().task) == str(tmp_path / "tensorflow_datasets")


def test_tests_prepare_unnamed_data_outside_home(tmp_path_factory):
  # conftest.py: a config naming no data folder (and the programs tests start) uses this one.
  data_dir = datasets.data_dir(default.get_config().task)
  assert data_dir.startswith(str(tmp_path_factory.getbasetemp()))


def _files(folder: str) -> dict[str, int]:
  """Path -> modification time (ns) of every file under `folder`."""
  return {
      os.path.join(d, f): os.stat(os.path.join(d, f)).st_mtime_ns for d, _, files in os.walk(folder)
      for f in files
  }


def test_prepared_pairs_read_back_in_order(tmp_path):
  dataset = _prepared(tmp_path)
  assert dataset.in_file_order  # pair_info turns TFDS's shuffling off
  sources = datasets.check_readable(dataset)
  for split, pairs in PAIRS.items():
    assert [(e[datasets.SOURCE_KEY].decode(), e[datasets.TARGET_KEY].decode())
            for e in (sources[split][i] for i in range(len(sources[split])))] == pairs
  written = _files(dataset.builder.data_dir)
  again = _prepared(tmp_path)  # prepared once: the second call reads what is there
  assert again.builder.data_dir == dataset.builder.data_dir
  assert _files(again.builder.data_dir) == written
  assert datasets.unreadable_info_folders(str(tmp_path)) == []


def test_a_failed_build_leaves_no_folder_behind(tmp_path, monkeypatch):
  monkeypatch.setattr(TinyPairs, "fail_after", 1)
  with pytest.raises(RuntimeError, match="the source went away"):
    _prepared(tmp_path / "data")
  assert not [path for path, _, files in os.walk(tmp_path / "data") if path.endswith("1.0.0")]
  assert not os.path.exists(tmp_path / "data" / "tiny_pairs")
  monkeypatch.setattr(TinyPairs, "fail_after", 0)
  assert len(datasets.check_readable(_prepared(tmp_path / "data"))["train"]) == 2


def test_an_example_without_text_is_refused_naming_the_folder(tmp_path):
  dataset = _prepared(tmp_path)
  folder = dataset.builder.data_dir
  with pytest.raises(datasets.DamagedDataError) as refused:
    datasets.check_example(dataset, "train", 7, {datasets.SOURCE_KEY: b"a", "target": None})
  assert str(refused.value) == (
      f"prepared data in {folder} is damaged (example 7 of split 'train' has no target text: a "
      f"truncated shard): move it aside (mv {folder} {folder}.damaged) and run again to prepare "
      "it again.")
  # The cause is the error's first line, or its type where it says nothing.
  assert "(RuntimeError)" in str(datasets.damaged(folder, RuntimeError("")))
  assert "(first line)" in str(datasets.damaged(folder, OSError("first line\nsecond line")))


def test_unreadable_info_folders_are_the_ones_whose_info_is_not_json(tmp_path):
  good = _prepared(tmp_path).builder.data_dir
  bad = tmp_path / "other_pairs" / "default" / "2.0.0"
  bad.mkdir(parents=True)
  (bad / "dataset_info.json").write_text("garbage{", encoding="utf-8")
  assert datasets.unreadable_info_folders(str(tmp_path)) == [str(bad)]
  assert os.path.exists(os.path.join(good, "dataset_info.json"))
