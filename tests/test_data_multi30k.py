"""Tests for relpos.data.multi30k: reading, the builder, download, and bad input; on a small
made-up folder in the raw layout, and on the real data (../shared/data/multi30k) when present."""

import functools
import gzip
import http.server
import os
import random
import shutil
import threading

import ml_collections
import pytest

from configs import default
from relpos.data import multi30k
from relpos.data import pipeline

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "multi30k")
NUM_LINES = {"train": 300, "val": 40, "test_2016_flickr": 30}


def _write_gz(path, data: bytes):
  with gzip.open(path, "wb") as f:
    f.write(data)


# A word and its translation: (English, German) of each slot of a made-up caption.
SUBJECTS = [("man", "Mann"), ("woman", "Frau"), ("dog", "Hund"), ("child", "Kind"),
            ("girl", "Mädchen"), ("boy", "Junge"), ("worker", "Arbeiter"), ("cat", "Katze")]
COLORS = [("red", "roten"), ("blue", "blauen"), ("green", "grünen"), ("black", "schwarzen"),
          ("white", "weißen"), ("yellow", "gelben")]
ACTIONS = [("is holding", "hält"), ("is carrying", "trägt"), ("is looking at", "betrachtet"),
           ("is painting", "malt"), ("is pulling", "zieht")]
OBJECTS = [("ball", "Ball"), ("bag", "Beutel"), ("hat", "Hut"), ("kite", "Drachen"),
           ("bicycle", "Fahrrad"), ("box", "Karton")]
PLACES = [("in the park", "im Park"), ("on the street", "auf der Straße"),
          ("at the beach", "am Strand"), ("near a fountain", "neben einem Brunnen")]


def fake_captions(count: int, rng: random.Random) -> tuple[list[str], list[str]]:
  """`count` made-up captions in English and their German translations, line for line."""
  english, german = [], []
  for _ in range(count):
    (s_en, s_de), (c_en, c_de), (a_en, a_de), (o_en, o_de), (p_en, p_de) = (
        rng.choice(words) for words in (SUBJECTS, COLORS, ACTIONS, OBJECTS, PLACES))
    english.append(f"A {s_en} {a_en} a {c_en} {o_en} {p_en}.")
    german.append(f"Ein {s_de} {a_de} einen {c_de} {o_de} {p_de}.")
  return english, german


@pytest.fixture(scope="session")
def raw_dir(tmp_path_factory):
  """A small Multi30K folder in the layout of the real data (`<stem>.<lang>.gz`, one sentence
  a line, line N of X.en translating line N of X.de), of made-up captions: no data needed."""
  directory = tmp_path_factory.mktemp("multi30k_raw")
  rng = random.Random(0)
  for stem, n in NUM_LINES.items():
    for lang, lines in zip(("en", "de"), fake_captions(n, rng)):
      _write_gz(directory / f"{stem}.{lang}.gz", ("\n".join(lines) + "\n").encode())
  return directory


def _task_config(data_dir, **fields) -> ml_collections.ConfigDict:
  config = default.get_config().task
  config.update(name="multi30k", tfds_data_dir=str(data_dir), vocab_size=120, **fields)
  return config


def test_shared_files_read_in_full():
  if not os.path.isdir(SHARED):
    pytest.skip(f"Multi30K is not at {SHARED}")
  pairs = multi30k.read_split(SHARED, "val", "en", "de")
  assert len(pairs) == 1014
  assert pairs[0][0].startswith("A group of men are loading cotton")
  assert multi30k.available_splits(SHARED, "en", "de") == list(multi30k.REQUIRED_SPLITS)


def test_builder_on_the_shared_folder(tmp_path):
  if not os.path.isdir(SHARED):
    pytest.skip(f"Multi30K is not at {SHARED}")
  dataset = multi30k.load(_task_config(tmp_path, manual_dir=SHARED), str(tmp_path))
  sources = dataset.data_sources()
  assert {s: len(sources[s]) for s in dataset.splits
         } == {"train": 29000, "validation": 1014, "test_2016_flickr": 1000}
  first = sources["test_2016_flickr"][0]
  assert (first["source"].decode(),
          first["target"].decode()) == multi30k.read_split(SHARED, "test_2016_flickr", "en",
                                                           "de")[0]


def test_builder_from_folder(raw_dir, tmp_path):
  task = pipeline.Task(_task_config(tmp_path, manual_dir=str(raw_dir)))
  assert task.splits == ("train", "validation", "test_2016_flickr")
  assert len(task.source_texts("train")) == 300
  assert len(task.target_texts("test_2016_flickr")) == 30
  sources = multi30k.read_lines(str(raw_dir / "val.en.gz"))
  targets = multi30k.read_lines(str(raw_dir / "val.de.gz"))
  assert sorted(zip(task.source_texts("validation"),
                    task.target_texts("validation"))) == sorted(zip(sources, targets))
  # The name the published runs' tokenizers were cached under (their config holds the
  # direction already): a rename would train them anew.
  assert os.path.basename(task.tokenizer.path) == "multi30k-en-de-1.0.0-unigram-120-seed0.model"


def test_manual_dir_expands_home_and_a_missing_one_is_named_once_prepared(
    raw_dir, tmp_path, monkeypatch, caplog):
  """`--config.task.manual_dir=~/m30k` reaches Python unexpanded; once the data is prepared the
  folder is only checked, and one that is gone (a typo, another machine) is said, not ignored."""
  monkeypatch.setenv("HOME", str(raw_dir.parent))
  dataset = multi30k.load(_task_config(tmp_path, manual_dir=f"~/{raw_dir.name}"), str(tmp_path))
  assert "train" in dataset.splits
  multi30k.load(_task_config(tmp_path, manual_dir="~/nowhere"), str(tmp_path))
  assert (f"task.manual_dir {raw_dir.parent}/nowhere does not exist: using the Multi30K "
          f"prepared in {tmp_path}") in caplog.text


def test_a_raw_file_changed_after_the_data_was_prepared_is_refused(raw_dir, tmp_path):
  """The prepared copy was read in silence, so a fixed or replaced file changed nothing."""
  directory = tmp_path / "raw"
  shutil.copytree(raw_dir, directory)
  config = _task_config(tmp_path / "tfds", manual_dir=str(directory))
  dataset = multi30k.load(config, str(tmp_path / "tfds"))
  # Compressed again with the same text (another gzip header): unchanged.
  _write_gz(directory / "val.de.gz", gzip.open(raw_dir / "val.de.gz").read())
  assert multi30k.load(config, str(tmp_path / "tfds")).splits == dataset.splits
  lines = multi30k.read_lines(str(directory / "val.de.gz"))
  _write_gz(directory / "val.de.gz", ("\n".join(["Ein Hund."] + lines[1:]) + "\n").encode())
  with pytest.raises(ValueError) as error:
    multi30k.load(config, str(tmp_path / "tfds"))
  assert str(error.value) == (
      f"task.manual_dir file {directory}/val.de.gz has changed since the Multi30K in "
      f"{dataset.builder.data_dir} was prepared from it: move that folder aside to prepare it "
      "again from the files as they are, or restore the file.")
  os.remove(directory / "val.de.gz")  # gone: the prepared copy is what there is
  assert multi30k.load(config, str(tmp_path / "tfds")).splits == dataset.splits


def test_other_language_pair_and_optional_split(raw_dir, tmp_path):
  directory = tmp_path / "raw"
  shutil.copytree(raw_dir, directory)
  for stem in NUM_LINES:  # a "fr" side: the German text stands in for it
    shutil.copy(directory / f"{stem}.de.gz", directory / f"{stem}.fr.gz")
  shutil.copy(directory / "val.en.gz", directory / "test_2017_flickr.en.gz")
  shutil.copy(directory / "val.de.gz", directory / "test_2017_flickr.fr.gz")
  task = pipeline.Task(_task_config(tmp_path / "tfds", manual_dir=str(directory), target_lang="fr"))
  assert "test_2017_flickr" in task.splits and "test_2017_mscoco" not in task.splits
  assert len(task.source_texts("test_2017_flickr")) == 40


@pytest.fixture
def serve(tmp_path):
  """Serves a folder over loopback HTTP; yields a function folder -> URL base."""
  servers = []

  def start(directory) -> str:
    handler = functools.partial(QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    servers.append(server)
    return f"http://127.0.0.1:{server.server_address[1]}/"

  yield start
  for server in servers:
    server.shutdown()
    server.server_close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
  """Serves files without logging each request to stderr."""
  def log_message(self, *args):
    del args


def test_download_through_loopback_server(raw_dir, tmp_path, serve):
  served = tmp_path / "served"
  shutil.copytree(raw_dir, served)
  shutil.copy(served / "val.en.gz", served / "test_2017_mscoco.en.gz")
  shutil.copy(served / "val.de.gz", served / "test_2017_mscoco.de.gz")
  url = serve(served)
  task = pipeline.Task(_task_config(tmp_path / "tfds", download_url=url))
  downloaded = tmp_path / "tfds" / "downloads" / "multi30k"
  assert sorted(os.listdir(downloaded)) == sorted(os.listdir(served))  # no temporaries left
  assert task.splits == ("train", "validation", "test_2016_flickr", "test_2017_mscoco")
  assert set(task.splits) <= set(pipeline.split_names(task.config))
  assert len(task.source_texts("train")) == 300
  assert task.source_texts("test_2017_mscoco") == multi30k.read_lines(str(raw_dir / "val.en.gz"))
  # Prepared: a later run needs neither the server nor the downloads.
  shutil.rmtree(downloaded)
  again = multi30k.load(_task_config(tmp_path / "tfds", download_url="http://127.0.0.1:9/"),
                        str(tmp_path / "tfds"))
  assert again.splits == task.splits


def test_failed_download_names_the_url_and_writes_no_dataset(raw_dir, tmp_path, serve):
  served = tmp_path / "served"
  shutil.copytree(raw_dir, served)
  os.remove(served / "train.de.gz")
  url = serve(served)
  data_dir = tmp_path / "tfds"
  with pytest.raises(FileNotFoundError, match=f"{url}train.de.gz: HTTP Error 404"):
    pipeline.Task(_task_config(data_dir, download_url=url))
  assert not os.path.exists(data_dir / "multi30k")
  assert not [f for f in os.listdir(data_dir / "downloads" / "multi30k") if "tmp" in f]


@pytest.mark.parametrize("case", ["mismatch", "empty", "missing", "not_utf8", "not_gzip"])
def test_bad_files_name_the_file_and_write_nothing(raw_dir, tmp_path, case):
  directory = tmp_path / "raw"
  shutil.copytree(raw_dir, directory)
  bad = directory / "val.de.gz"
  if case == "mismatch":
    _write_gz(bad, b"eins\nzwei\n")
    expected = "val.en.gz \\(40 lines\\) and .*val.de.gz \\(2 lines\\) differ"
  elif case == "empty":
    _write_gz(bad, b"")
    expected = "val.de.gz is empty"
  elif case == "missing":
    os.remove(bad)
    expected = "val.de.gz does not exist"
  elif case == "not_utf8":
    _write_gz(bad, "Grüße\n".encode("latin-1") * 40)
    expected = "val.de.gz is not UTF-8 text"
  else:
    bad.write_bytes(b"plain text, not gzip\n")
    expected = "val.de.gz is not a readable gzip file"
  data_dir = tmp_path / "tfds"
  config = _task_config(data_dir, manual_dir=str(directory))
  with pytest.raises((ValueError, FileNotFoundError), match=expected):
    pipeline.Task(config)
  assert not os.path.exists(data_dir / "multi30k")  # nothing half-written, no empty folders
  shutil.copy(raw_dir / "val.de.gz", bad)  # fixed: the next run builds the dataset
  assert multi30k.load(config, str(data_dir)).builder.is_prepared()


def test_line_ends_are_not_split_further(tmp_path):
  path = tmp_path / "x.en.gz"
  _write_gz(path, "one\u2028still one\r\ntwo\n".encode())
  assert multi30k.read_lines(str(path)) == ["one\u2028still one", "two"]


def test_unknown_language_code(tmp_path):
  with pytest.raises(ValueError, match="task.target_lang='xx'.*en, de, fr, cs"):
    pipeline.Task(_task_config(tmp_path, manual_dir=str(tmp_path), target_lang="xx"))
  with pytest.raises(ValueError, match="task.source_lang='EN'"):
    multi30k.load(_task_config(tmp_path, source_lang="EN"), str(tmp_path))
  with pytest.raises(ValueError, match="both 'en'"):
    multi30k.Multi30kConfig("en", "en")
  assert not os.listdir(tmp_path)
