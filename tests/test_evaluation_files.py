"""Tests for relpos.evaluation_files: an evaluation's output names, and its files written whole
(translations, results, and the sources of a split stored out of its files' order)."""

import json
import os
import pathlib

import ml_collections

from relpos import evaluation_files


def test_output_names_say_what_was_evaluated():
  name = evaluation_files.output_name
  assert name("test", "latest", 12, 4, 0.6) == "test.latest.step12.beam4.alpha0.6"
  assert name("test", "average:2", 12, 4, 0.6) == "test.average2.step12.beam4.alpha0.6"
  assert name("test", 8, 8, 1, 0.0) == "test.step8.beam1.alpha0.0"
  assert name("input-test", "best", 6, 4, 0.6) == "input-test.best.step6.beam4.alpha0.6"


def _config(beam_size=4, alpha=0.6, max_decode_len=0):
  return ml_collections.ConfigDict(
      {"decode": {"beam_size": beam_size, "alpha": alpha, "max_decode_len": max_decode_len}})


def test_another_decoding_limit_is_another_evaluation(tmp_path):
  """Outputs are replaced only by the same evaluation: the same name decoded with another
  decode.max_decode_len goes beside them, and so does anything beside a JSON written before the
  limit was recorded (its limit unknown: kept, never overwritten)."""
  out = tmp_path / "eval"
  first = evaluation_files.write_evaluation(str(out), "w", _config(), "best", 7, ["x"],
                                            {"bleu": 1.0}, split="test")
  assert first["max_decode_len"] == 0
  stem = str(out / "test.best.step7.beam4.alpha0.6")
  again = evaluation_files.write_evaluation(str(out), "w", _config(), "best", 7, ["x"],
                                            {"bleu": 1.0}, split="test")
  assert again["translations_file"] == stem + ".txt"  # the same evaluation: replaced
  other = evaluation_files.write_evaluation(str(out), "w", _config(max_decode_len=5), "best", 7,
                                            ["y"], {"bleu": 2.0}, split="test")
  assert other["translations_file"] == stem + ".2.txt"
  old = json.loads(pathlib.Path(stem + ".json").read_text())
  del old["max_decode_len"]
  pathlib.Path(stem + ".json").write_text(json.dumps(old))
  beside = evaluation_files.write_evaluation(str(out), "w", _config(), "best", 7, ["z"],
                                             {"bleu": 3.0}, split="test")
  assert beside["translations_file"] == stem + ".3.txt"
  assert pathlib.Path(stem + ".txt").read_text() == "x\n"


def test_sources_are_written_line_by_line_beside_the_translations(tmp_path, caplog):
  out = tmp_path / "eval"
  results = evaluation_files.write_evaluation(str(out), "w", _config(), "best", 7, ["x y", "z"],
                                              {"bleu": 1.0}, split="test", sources=["a b", "c"])
  stem = str(out / "test.best.step7.beam4.alpha0.6")
  assert results["translations_file"] == stem + ".txt"
  assert results["sources_file"] == stem + ".sources.txt"
  assert (out / "test.best.step7.beam4.alpha0.6.sources.txt").read_text() == "a b\nc\n"
  assert (out / "test.best.step7.beam4.alpha0.6.txt").read_text() == "x y\nz\n"
  assert json.loads((out / "test.best.step7.beam4.alpha0.6.json").read_text()) == results
  assert "--input" in caplog.text  # how to keep a file's order
  plain = evaluation_files.write_evaluation(str(out), "w", _config(beam_size=1), "best", 7, ["q"],
                                            {}, split="test")
  assert "sources_file" not in plain
  assert sorted(p.name for p in out.iterdir()) == [
      "test.best.step7.beam1.alpha0.6.json", "test.best.step7.beam1.alpha0.6.txt",
      "test.best.step7.beam4.alpha0.6.json", "test.best.step7.beam4.alpha0.6.sources.txt",
      "test.best.step7.beam4.alpha0.6.txt"
  ]


def test_the_write_check_leaves_no_folder_or_file_behind(tmp_path):
  evaluation_files.check_writable(str(tmp_path / "new" / "eval"))
  assert not (tmp_path / "new").exists()
  (tmp_path / "kept").mkdir()
  evaluation_files.check_writable(str(tmp_path / "kept"))
  assert os.listdir(tmp_path / "kept") == []


def test_paths_are_absolute_for_a_relative_output_folder(tmp_path, monkeypatch):
  """`eval.py --workdir=runs/rel_k` writes into runs/rel_k/eval: its JSON names the files as it
  names the workdir, absolute, so it can be read from any folder."""
  monkeypatch.chdir(tmp_path)
  results = evaluation_files.write_evaluation("runs/eval", "runs", _config(), "best", 7, ["x"], {},
                                              split="test")
  stem = str(tmp_path / "runs" / "eval" / "test.best.step7.beam4.alpha0.6")
  assert results["translations_file"] == stem + ".txt"
  assert results["workdir"] == str(tmp_path / "runs")
