"""Tests for relpos.data.wmt14: the catalog builder through TFDS mock data.

TensorFlow is not a requirement: where it is not installed, these tests also show that reading
WMT14 (mocked) needs none.
"""

import os

import numpy as np
import pytest
import tensorflow_datasets as tfds

from configs import default
from relpos.data import pipeline
from relpos.data import wmt14


def _task_config(data_dir, **fields):
  config = default.get_config().task
  config.update(name="wmt14", tfds_data_dir=str(data_dir), vocab_size=80, max_length=64, **fields)
  return config


def test_mock_data_through_the_pipeline(tmp_path, monkeypatch):
  # Mocked, the builder is never prepared, so pretend TensorFlow could prepare it.
  monkeypatch.setattr(wmt14, "tensorflow_installed", lambda: True)
  with tfds.testing.mock_data(num_examples=12):
    task = pipeline.Task(_task_config(tmp_path, source_lang="en", target_lang="de"))
    assert task.splits == ("train", "validation", "test")
    assert not task.in_file_order  # the catalog's builder lets TFDS shuffle each split
    sources, targets = task.source_texts("train"), task.target_texts("train")
    assert len(sources) == len(targets) == 12 and sources != targets
    reverse = pipeline.Task(_task_config(tmp_path, source_lang="de", target_lang="en"))
    assert reverse.source_texts("test") == task.target_texts("test")
    # One config holds both directions, and each trains its tokenizer on its own order of the
    # text: each caches its own.
    names = {os.path.basename(t.tokenizer.path) for t in (task, reverse)}
    assert names == {
        "wmt14_translate-de-en-en_to_de-1.0.0-unigram-80-seed0.model",
        "wmt14_translate-de-en-de_to_en-1.0.0-unigram-80-seed0.model"
    }
    batch = next(task.train_iterator(2, seed=0))
    assert batch["inputs"].shape == (2, 64)
    assert (batch["inputs_segmentation"] > 0).sum() == (batch["inputs"] > 0).sum() > 0
    assert np.array_equal(
        task.eval_examples("test")[0]["inputs"],
        task.tokenizer.encode(task.source_texts("test")[0]))


def test_unprepared_without_tensorflow_says_how_to_prepare(tmp_path, monkeypatch):
  monkeypatch.setattr(wmt14, "tensorflow_installed", lambda: False)
  with pytest.raises(  # an OSError: the command line shows it in one line (cli.USER_ERRORS)
      FileNotFoundError, match=f"not prepared in {tmp_path}.*tfds build "
      "wmt14_translate/de-en --file_format=array_record"):
    pipeline.Task(_task_config(tmp_path))


def test_languages_must_be_en_and_de(tmp_path):
  with pytest.raises(ValueError, match="task.target_lang='fr' is invalid.*de, en"):
    pipeline.Task(_task_config(tmp_path, target_lang="fr"))
  with pytest.raises(ValueError, match="both 'de'"):
    pipeline.Task(_task_config(tmp_path, source_lang="de", target_lang="de"))
