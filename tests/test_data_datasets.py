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


class _FakeBuilder:
  """A builder over a `disk` (a set of prepared dataset names) several processes share."""
  name = "fake"

  def __init__(self, disk):
    self.disk = disk

  def is_prepared(self):
    return self.name in self.disk


@pytest.mark.parametrize("index, shared, prepares", [(0, True, 1), (1, True, 0), (1, False, 1)])
def test_of_several_processes_the_first_prepares_and_the_others_wait(monkeypatch, index, shared,
                                                                     prepares):
  """On a shared data folder only process 0 writes the dataset (they all raced to before); a
  process whose host has a folder of its own prepares it there after process 0."""
  disk, calls = set(), []
  monkeypatch.setattr(datasets.jax, "process_count", lambda: 2)
  monkeypatch.setattr(datasets.jax, "process_index", lambda: index)

  def sync(name):  # process 0 has written the shared folder by the time the others pass
    calls.append(name)
    if shared:
      disk.add("fake")

  monkeypatch.setattr(datasets.multihost_utils, "sync_global_devices", sync)
  prepared = []
  builder = datasets.prepared(lambda: _FakeBuilder(disk), lambda b:
                              (prepared.append(b), b.disk.add(b.name)))
  assert builder.is_prepared() and len(prepared) == prepares
  assert calls == ["relpos: fake prepared"]


def test_a_failure_of_process_0_is_raised_after_the_others_stop_waiting(monkeypatch):
  calls = []
  monkeypatch.setattr(datasets.jax, "process_count", lambda: 2)
  monkeypatch.setattr(datasets.jax, "process_index", lambda: 0)
  monkeypatch.setattr(datasets.multihost_utils, "sync_global_devices", calls.append)

  def fail(builder):
    raise OSError("download failed")

  with pytest.raises(OSError, match="download failed"):
    datasets.prepared(lambda: _FakeBuilder(set()), fail)
  assert calls == ["relpos: fake prepared"]
