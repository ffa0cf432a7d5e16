"""Evaluation: eval.py reproduces in-training validation, translates every sentence, and
rejects bad input with errors that name it."""
import json
import os
import re
import shutil
import subprocess
import sys

import jax
import ml_collections
import numpy as np
import pytest
from flax import nnx

from configs import tiny
from relpos import checkpoints
from relpos import run_config
from relpos import scoring
from relpos import decode
from relpos import device_mesh
from relpos import evaluate
from relpos import json_files
from relpos import metrics_writer
from relpos import model as model_lib
from relpos.data import pipeline
from relpos.data import tokenizer as tokenizer_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(name="run")
def run_fixture(translating_run):
  """(config, workdir, validation records by step) of conftest's TRANSLATING_RUN: evaluations
  at 100, 200, 300 and 400 with BLEU above 0, checkpoints 300 and 400."""
  return translating_run


def test_evaluate_reproduces_in_training_validation(run, tmp_path):
  _, workdir, validation = run
  assert validation[300]["bleu"] != validation[400]["bleu"]
  for checkpoint, step in (("latest", 400), (300, 300), ("best",
                                                         max((300, 400),
                                                             key=lambda s: validation[s]["bleu"]))):
    result = evaluate.evaluate_checkpoint(workdir, checkpoint=checkpoint, split="validation",
                                          output_dir=str(tmp_path))
    assert result["step"] == step
    for key in ("bleu", "chrf", "signature", "num_sentences"):
      assert result[key] == validation[step][key], key
  assert result["bleu"] == max(validation[s]["bleu"] for s in validation)


def test_outputs_one_translation_per_sentence_and_the_json(run, tmp_path):
  config, workdir, _ = run
  result = evaluate.evaluate_checkpoint(workdir, checkpoint=300, split="test", beam_size=1,
                                        alpha=0.0, output_dir=str(tmp_path))
  assert (result["step"], result["beam_size"], result["alpha"]) == (300, 1, 0.0)
  with open(result["translations_file"], encoding="utf-8") as f:
    assert len(f.read().split("\n")) - 1 == config.task.synthetic.num_test
  with open(result["translations_file"][:-len(".txt")] + ".json", encoding="utf-8") as f:
    assert json.load(f) == result
  assert result["num_sentences"] == config.task.synthetic.num_test
  assert set(result) >= {"bleu", "signature", "chrf", "step"}


def test_input_file_overlong_lines_are_translated(run, tmp_path, caplog):
  config, workdir, _ = run
  task_sources = pipeline.get_task(config.task).source_texts("validation")
  long_line = " ".join(task_sources * 3)  # longer than training's max_length and model.max_len
  sources = tmp_path / "sources.txt"
  sources.write_text("\n".join([task_sources[0], long_line, ""]) + "\n", encoding="utf-8")
  references = tmp_path / "references.txt"
  references.write_text("a\nb  b\nc…\n", encoding="utf-8")
  result = evaluate.evaluate_checkpoint(workdir, input_file=str(sources),
                                        reference_file=str(references), output_dir=str(tmp_path))
  assert result["num_sentences"] == 3 and "bleu" in result
  # A reference no translation can match (a character the tokenizer never saw) is named; a
  # double space, which BLEU ignores too, is not.
  assert (f"1 of 3 references of {references} do not survive the tokenizer's round trip"
          in caplog.text) and "(number 3): 'c…' decodes as 'c ⁇ '" in caplog.text
  with open(result["translations_file"], encoding="utf-8") as f:
    assert len(f.read().split("\n")) == 4


def test_input_file_line_beyond_the_source_bound_is_refused_naming_it(run, tmp_path):
  config, workdir, _ = run
  task_sources = pipeline.get_task(config.task).source_texts("validation")
  document = " ".join(task_sources * 5)  # 2,351 tokens: a document pasted as one line
  sources = tmp_path / "document.txt"
  sources.write_text("\n".join([task_sources[0], document]) + "\n", encoding="utf-8")
  with pytest.raises(ValueError, match=r"document\.txt:2 has 2351 tokens, more than the 2048 "):
    evaluate.evaluate_checkpoint(workdir, input_file=str(sources), output_dir=str(tmp_path))
  assert list(tmp_path.iterdir()) == [sources]  # refused before any translation was written


class _CharTokenizer:
  """Stands in for the SentencePiece tokenizer: one id per character, then eos."""
  def encode(self, text: str) -> list[int]:
    return [3 + ord(c) % 50 for c in text] + [1]


def test_sentences_of_a_file_saved_with_a_bom_and_crlf_line_ends(tmp_path):
  path = tmp_path / "refs.txt"
  path.write_bytes("\ufeffdas ist ein Haus\r\nein Hund\r\n".encode("utf-8"))
  assert evaluate.read_sentences(str(path)) == ["das ist ein Haus", "ein Hund"]
  # Old Mac line ends (a lone \r): the file read as one sentence, cut at the decode budget.
  path.write_bytes(b"das ist ein Haus\rein Hund\r")
  with pytest.raises(
      ValueError, match=re.escape(
          f"{path} line 1 holds a carriage return (\\r) inside it: one reference sentence a line, "
          "ended by \\n or \\r\\n.")):
    evaluate.read_sentences(str(path), "reference")


def test_source_batches_keep_every_sentence_whole():
  texts = ["x" * n for n in (5, 40, 0, 17, 3, 70, 9)]
  seen = {}
  for example_index, inputs in evaluate.source_batches(_CharTokenizer(), texts, 4):
    assert inputs.shape[0] == 4 and inputs.shape[1] % evaluate.LENGTH_BUCKET == 0
    for i, row in zip(example_index, inputs):
      if i >= 0:
        seen[int(i)] = int(np.sum(row != 0))
      else:
        assert row.tolist()[:2] == [1, 0]  # filler rows hold a lone eos
  assert seen == {i: len(t) + 1 for i, t in enumerate(texts)}


def test_decode_budget_follows_the_source_length():
  decode_config = tiny.get_config().decode
  assert evaluate.max_decode_len(16, decode_config, 256) == 42
  assert evaluate.max_decode_len(160, decode_config, 256) == 256
  decode_config.max_decode_len = 20
  assert evaluate.max_decode_len(160, decode_config, 256) == 20


def test_bad_inputs_name_the_culprit(run, tmp_path, monkeypatch):
  _, workdir, _ = run
  empty = tmp_path / "empty.txt"
  empty.write_bytes(b"")
  with pytest.raises(ValueError, match=f"source file {empty} is empty"):
    evaluate.evaluate_checkpoint(workdir, input_file=str(empty))
  blank = tmp_path / "blank.txt"
  blank.write_text("\n \n\n", encoding="utf-8")
  with pytest.raises(ValueError, match=f"source file {blank} holds blank lines only"):
    evaluate.evaluate_checkpoint(workdir, input_file=str(blank))
  latin1 = tmp_path / "latin1.txt"
  latin1.write_bytes("Grüße\n".encode("latin-1"))
  with pytest.raises(ValueError, match=rf"{latin1} is not UTF-8 text: byte 2 is b'\\xfc'"):
    evaluate.evaluate_checkpoint(workdir, input_file=str(latin1))
  good = tmp_path / "good.txt"
  good.write_text("one\ntwo\n", encoding="utf-8")
  short = tmp_path / "short.txt"
  short.write_text("one\n", encoding="utf-8")
  with pytest.raises(ValueError, match=f"{short} has 1 lines but {good} has 2"):
    evaluate.evaluate_checkpoint(workdir, input_file=str(good), reference_file=str(short))
  with pytest.raises(ValueError, match=f"reference file {empty} is empty: one reference sentence"):
    evaluate.evaluate_checkpoint(workdir, input_file=str(good), reference_file=str(empty))
  with pytest.raises(
      ValueError, match=r"reference_file \(--reference\) goes with input_file "
      r"\(--input\): split 'test' is scored against its own references."):
    evaluate.evaluate_checkpoint(workdir, split="test", reference_file=str(good))
  with pytest.raises(ValueError, match=r"give exactly one of split \(--split\) and input_file"):
    evaluate.evaluate_checkpoint(workdir, split="test", input_file=str(good))
  with monkeypatch.context() as patched:  # a mistyped split is refused before data is prepared
    patched.setattr(pipeline, "get_task", lambda *_: pytest.fail("the task was prepared"))
    with pytest.raises(
        ValueError, match=r"split='dev' is not a split of task 'synthetic'; "
        r"allowed: train, validation, test, test_long\.$"):  # the splits this task makes
      evaluate.evaluate_checkpoint(workdir, split="dev")
    with pytest.raises(
        ValueError, match=r"split='test_long_seen' is not a split of task 'synthetic' \(set "
        r"task.synthetic.num_test_long_seen to make it\); allowed: train, validation, test, "
        r"test_long\.$"):
      evaluate.evaluate_checkpoint(workdir, split="test_long_seen")
  with pytest.raises(FileNotFoundError, match="no checkpoint at step 5 in .*saved steps"):
    evaluate.evaluate_checkpoint(workdir, checkpoint=5, split="validation")
  for name in ("newest", "average:1", "400x"):  # refused before any data or checkpoint is read
    with pytest.raises(
        ValueError, match=f"checkpoint='{name}': must be 'latest', 'best', a step "
        "number or 'average:<N>' with N >= 2."):
      evaluate.evaluate_checkpoint(workdir, checkpoint=name, split="validation")
  missing = str(tmp_path / "missing")
  with pytest.raises(FileNotFoundError, match=f"workdir {missing} does not exist"):
    evaluate.evaluate_checkpoint(missing, split="validation")
  with pytest.raises(FileNotFoundError, match="config.json does not exist"):
    evaluate.evaluate_checkpoint(str(tmp_path), split="validation")


def test_a_run_evaluated_with_another_tokenizer_is_refused_before_restoring(
    run, tmp_path, monkeypatch):
  config, workdir, _ = run

  def restore_model(*args, **kwargs):
    raise AssertionError("the model was restored before the tokenizer was checked")

  monkeypatch.setattr(evaluate, "restore_model", restore_model)
  recorded = metrics_writer.read_starts(workdir)[-1]["tokenizer_sha256"]
  assert recorded == pipeline.get_task(config.task).tokenizer.sha256()  # the run's own
  copy = str(tmp_path / "run")
  shutil.copytree(workdir, copy)
  metrics_writer.record_start(copy, 300, "abc1234", tokenizer_sha256="0" * 64)  # trained on another
  with pytest.raises(
      ValueError, match=f"is not the one the checkpoints in {copy} were trained "
      rf"with \(sha256 000000000000, starts.jsonl\)"):
    evaluate.evaluate_checkpoint(copy, split="test")
  assert not os.path.exists(os.path.join(copy, "eval"))


def test_evaluating_after_the_variants_file_was_edited_warns(run, tmp_path, monkeypatch, caplog):
  """eval.py runs the variant's file as it is now; its checkpoints were trained by another."""
  _, workdir, _ = run
  copy = str(tmp_path / "run")
  shutil.copytree(workdir, copy)
  metrics_writer.record_start(copy, 300, "abc1234", {"file": "/x/mine.py", "sha256": "a" * 64})
  monkeypatch.setattr(evaluate.user_modules, "variant_code",
                      lambda position: {"file": "/x/mine.py", "sha256": "b" * 64})
  evaluate.evaluate_checkpoint(copy, split="validation", output_dir=str(tmp_path / "eval"))
  assert ("/x/mine.py was edited since this run's last start (sha256 aaaaaaaaaaaa, now "
          "bbbbbbbbbbbb)") in caplog.text and "evaluating with the file as it is" in caplog.text


def test_workdir_without_checkpoint(run, tmp_path):
  _, workdir, _ = run
  os.symlink(os.path.join(workdir, "config.json"), tmp_path / "config.json")
  with pytest.raises(FileNotFoundError, match=f"no checkpoint is ready in {tmp_path}/checkpoints"):
    evaluate.evaluate_checkpoint(str(tmp_path), split="validation")
  assert not (tmp_path / "eval").exists()  # the output folder's check leaves nothing behind


def test_eval_cli_reproduces_validation_and_runs_no_workdir_code(run, tmp_path):
  workdir = str(tmp_path / "run")
  shutil.copytree(run[1], workdir)
  validation = run[2]
  marker = tmp_path / "executed"
  for name in ("config.py", "__init__.py", "sitecustomize.py"):
    with open(os.path.join(workdir, name), "w", encoding="utf-8") as f:
      f.write(f"open({str(marker)!r}, 'w').close()\n")
  done = subprocess.run([
      sys.executable,
      os.path.join(ROOT, "eval.py"), f"--workdir={workdir}", "--split=validation",
      f"--output_dir={tmp_path}"
  ], cwd=workdir, capture_output=True, text=True, check=False, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  result = json.loads(done.stdout)
  assert result["bleu"] == validation[400]["bleu"] and result["chrf"] == validation[400]["chrf"]
  assert result["bleu_tokenized_lowercase"] > 0  # the literature's BLEU (relpos.scoring)
  assert "pre:moses-lc-norm-tok:de|" in result["tokenized_lowercase_signature"]
  assert not marker.exists()
  for folder, _, files in os.walk(workdir):
    for name in files:
      with open(os.path.join(folder, name), "rb") as f:
        head = f.read(2)
      # Pickles (protocol 2 to 5) start with PROTO (0x80) then the protocol number.
      assert not name.endswith((".pkl", ".pickle"))
      assert head not in (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05"), name


def test_translations_never_use_ids_beyond_a_smaller_tokenizer(tmp_path):
  """A model built for task.vocab_size=64 whose logits favour the ids a smaller tokenizer
  lacks still translates into decodable text."""
  tokenizer = tokenizer_lib.train_tokenizer(
      ["the dog sees the cat", "a small bird sings near the river"] * 50, vocab_size=64,
      model_type="unigram", seed=0)
  assert tokenizer.vocab_size < 64
  config = tiny.get_config()
  config.model.logits_via_embedding = False
  model = model_lib.build_model(run_config.validate(config).model, seed=0)
  phantom = np.arange(64) >= tokenizer.vocab_size
  model.decoder.logits.bias[...] = np.where(phantom, 50.0, 0.0).astype(np.float32)
  texts = ["the dog sees the cat", "a bird"]
  for beam_size in (1, 2):
    config.decode.beam_size = beam_size
    translations = evaluate.translate_texts(model, tokenizer, texts, config,
                                            mesh=device_mesh.make_mesh())
    assert len(translations) == 2 and all(t and "⁇" not in t for t in translations)
  _, inputs = next(evaluate.source_batches(tokenizer, texts, 2))
  unmasked = np.asarray(decode.translate(model, inputs, beam_size=1, max_decode_len=4))
  assert (unmasked >= tokenizer.vocab_size).all()  # what the tokenizer would choke on


def test_an_eval_batch_size_the_devices_do_not_divide_is_rounded_up(monkeypatch):
  """A run trained with train.eval_batch_size=3 on 1 or 3 devices, evaluated on 4: the batch
  takes a filler row, and each text gets its own row's output, in the order of the texts.

  The untrained model translates everything as '', so the search runs but its output is
  replaced by each row's source: every text's translation is itself, and a filler row's output
  (eos first: '') or another row's given to a text shows."""
  tokenizer = tokenizer_lib.train_tokenizer(
      ["the dog sees the cat", "a small bird sings near the river"] * 50, vocab_size=64,
      model_type="unigram", seed=0)
  config = tiny.get_config()
  model = model_lib.build_model(run_config.validate(config).model, seed=0)
  texts = ["the dog sees the cat", "a bird", "the river", "a cat", "the small bird"]
  assert [tokenizer.decode(tokenizer.encode(text)) for text in texts] == texts
  mesh = device_mesh.make_mesh()
  assert mesh.size == 4
  rows = []
  translate = evaluate.decode.translate

  def copy_the_source(searched, inputs, **kw):
    tokens = translate(searched, inputs, **kw)  # the real search, sharded over the 4 devices
    assert tokens.shape[0] == inputs.shape[0]
    rows.append(inputs.shape[0])
    return inputs

  monkeypatch.setattr(evaluate.decode, "translate", copy_the_source)
  translated = {}
  for batch_size in (3, 4):
    config.train.eval_batch_size = batch_size
    translated[batch_size] = evaluate.translate_texts(model, tokenizer, texts, config, mesh=mesh)
  assert rows == [4, 4, 4, 4]  # 5 texts in 2 batches of 4 rows (3 filler rows) each time
  assert all(translated[4]) and len(set(translated[4])) == len(texts)  # non-empty, distinct
  assert translated[3] == translated[4] == texts


def test_the_longest_batch_runs_first_so_what_cannot_run_stops_before_any_work(monkeypatch):
  """A source longer than a learned absolute table fails in the model: with the batches
  shortest first, it failed after every other translation, which were lost with it."""
  sentences = ["the dog sees the cat", "a small bird sings near the river"]
  tokenizer = tokenizer_lib.train_tokenizer(sentences * 50, vocab_size=64, model_type="unigram",
                                            seed=0)
  config = tiny.get_config()
  config.model.update(position="absolute", absolute_type="learned", max_len=16)
  config.task.max_length = 16
  config.train.eval_batch_size = 4
  model = model_lib.build_model(run_config.validate(config).model, seed=0)
  translated = []
  translate = evaluate.decode.translate
  monkeypatch.setattr(
      evaluate.decode, "translate",
      lambda model, inputs, **kw: translated.append(inputs.shape) or translate(model, inputs, **kw))
  texts = ["a bird", "the cat", "a dog", "the river", " ".join(sentences * 3)]
  with pytest.raises(ValueError, match="longer than the learned absolute table"):
    evaluate.translate_texts(model, tokenizer, texts, config, mesh=device_mesh.make_mesh())
  assert len(translated) == 1 and translated[0][1] > 16


def test_a_learned_absolute_table_translates_every_source_that_fits_it():
  """Batches pad to a multiple of LENGTH_BUCKET, but never past model.max_len when their
  sources fit it: a learned table as long as the source has no position for padding beyond."""
  sentences = ["the dog sees the cat", "a small bird sings near the river"]
  tokenizer = tokenizer_lib.train_tokenizer(sentences * 50, vocab_size=64, model_type="unigram",
                                            seed=0)
  text = " ".join(sentences * 2)
  length = len(tokenizer.encode(text))
  if length % evaluate.LENGTH_BUCKET == 0:
    text, length = text + " a", len(tokenizer.encode(text + " a"))
  _, inputs = next(evaluate.source_batches(tokenizer, [text], 1, max_len=length))
  assert inputs.shape == (1, length)  # not padded to the next multiple of 16
  _, inputs = next(evaluate.source_batches(tokenizer, [text], 1, max_len=length - 1))
  assert inputs.shape[1] % evaluate.LENGTH_BUCKET == 0  # too long for it: padded as ever
  config = tiny.get_config()
  config.model.update(position="absolute", absolute_type="learned", max_len=length)
  model = model_lib.build_model(run_config.validate(config).model, seed=0)
  [translation] = evaluate.translate_texts(model, tokenizer, [text], config,
                                           mesh=device_mesh.make_mesh())
  assert isinstance(translation, str)


def test_average_of_the_last_checkpoints(run, tmp_path):
  config, workdir, _ = run
  mesh = device_mesh.make_mesh()
  manager = checkpoints.make_manager(workdir, read_only=True)
  last_two = sorted(manager.all_steps())[-2:]
  manager.close()
  validated = run_config.validate(config)
  models = [evaluate.restore_model(workdir, validated, step, mesh)[0] for step in last_two]
  averaged, step = evaluate.restore_model(workdir, validated, "average:2", mesh)
  assert last_two == [300, 400] and step == 400
  want = jax.tree.map(lambda a, b: (a + b) / 2, *(nnx.state(m, nnx.Param) for m in models))
  jax.tree.map(np.testing.assert_allclose, nnx.state(averaged, nnx.Param), want)
  result = evaluate.evaluate_checkpoint(workdir, checkpoint="average:2", split="validation",
                                        output_dir=str(tmp_path))
  assert result["checkpoint"] == "average:2" and result["step"] == 400
  with pytest.raises(
      FileNotFoundError, match=r"average:9: the run in .* has saved 4 checkpoints "
      r"on schedule up to its newest, step 400; average fewer\."):
    evaluate.restore_model(workdir, validated, "average:9", mesh)
  with pytest.raises(
      FileNotFoundError, match=r"average:3: .* lacks steps \[200\] of the last 3 "
      r"checkpoints saved on schedule up to step 400 \(it holds \[300, 400\]\)"):
    evaluate.restore_model(workdir, validated, "average:3", mesh)
  with pytest.raises(ValueError, match=r"average:<N> needs an integer N >= 2"):
    evaluate.restore_model(workdir, validated, "average:1", mesh)


def test_averaging_sums_one_model_at_a_time_as_the_mean_of_all():
  """average:N held N models on the device at once; a generator now gives them one by one, and
  the mean is the same to the bit (summed in the same order)."""
  model_config = run_config.validate(tiny.get_config()).model
  params = [nnx.state(model_lib.build_model(model_config, seed), nnx.Param) for seed in range(3)]
  held = []

  def one_at_a_time():
    for seed in range(3):
      held.append(seed)
      yield model_lib.build_model(model_config, seed)

  averaged = evaluate.average_parameters(one_at_a_time())
  want = jax.tree.map(lambda *values: sum(values) / len(values), *params)
  jax.tree.map(np.testing.assert_array_equal, nnx.state(averaged, nnx.Param), want)
  assert held == [0, 1, 2]


def test_average_is_of_the_last_checkpoints_on_schedule_or_refused():
  """The best checkpoint is kept beside the newest ones: an old best is not averaged in the
  place of a step that was not kept."""
  train_config = ml_collections.ConfigDict(
      {"checkpoint_every_steps": 100, "eval_every_steps": 100, "num_steps": 600})
  assert evaluate.averaged_steps("w", [200, 500, 600], train_config, 2) == [500, 600]
  with pytest.raises(
      FileNotFoundError, match=r"w lacks steps \[400\] of the last 3 checkpoints "
      r"saved on schedule up to step 600 \(it holds \[200, 500, 600\]\)"):
    evaluate.averaged_steps("w", [200, 500, 600], train_config, 3)
  # A checkpoint saved on SIGTERM is left out; the newest on schedule ends the average.
  assert evaluate.averaged_steps("w", [400, 500, 552, 600, 601], train_config, 3) == [400, 500, 600]
  with pytest.raises(FileNotFoundError, match="has saved 0 checkpoints on schedule"):
    evaluate.averaged_steps("w", [552], train_config, 2)


def test_another_evaluation_never_replaces_an_output(run, tmp_path, caplog):
  """A split, then a file of the same name, then the same file again, then another folder's
  file of that name: three evaluations, three pairs of files; the repeat replaces its own."""
  config, workdir, _ = run
  mine, theirs = tmp_path / "mine", tmp_path / "theirs"
  sources = pipeline.get_task(config.task).source_texts("test")
  for folder, count in ((mine, 3), (theirs, 2)):
    folder.mkdir()
    (folder / "test").write_text("\n".join(sources[:count]) + "\n", encoding="utf-8")
  out = str(tmp_path / "out")
  evaluate_test = lambda checkpoint=300, **kw: evaluate.evaluate_checkpoint(
      workdir, checkpoint=checkpoint, beam_size=1, output_dir=out, **kw)
  split = evaluate_test(split="test")
  first = evaluate_test(input_file=str(mine / "test"))
  again = evaluate_test(input_file=str(mine / "test"))
  other = evaluate_test(input_file=str(theirs / "test"))
  stem = os.path.join(out, "input-test.step300.beam1.alpha0.6")
  assert split["translations_file"] == os.path.join(out, "test.step300.beam1.alpha0.6.txt")
  assert first["translations_file"] == again["translations_file"] == stem + ".txt"
  assert other["translations_file"] == stem + ".2.txt"
  assert f"{stem}.json holds another evaluation; writing {stem}.2.json" in caplog.text
  names = ("test.step300.beam1.alpha0.6", "input-test.step300.beam1.alpha0.6",
           "input-test.step300.beam1.alpha0.6.2")
  assert sorted(os.listdir(out)) == sorted(
      f"{name}.{ext}" for name in names for ext in ("txt", "json"))
  for result, count in ((split, config.task.synthetic.num_test), (again, 3), (other, 2)):
    assert json_files.read_json(result["translations_file"][:-4] + ".json") == result
    with open(result["translations_file"], encoding="utf-8") as f:
      assert f.read().count("\n") == count
  with open(split["translations_file"], encoding="utf-8") as f:
    translations = f.read().splitlines()
  references = pipeline.get_task(config.task).target_texts("test")
  assert split["bleu"] == scoring.score(translations, references,
                                        language=config.task.target_lang)["bleu"]
  assert "bleu" not in again  # no reference for an input file
  assert other["input_file"] == str(theirs / "test") and split["split"] == "test"
  latest = evaluate_test(split="test", checkpoint="latest")
  assert latest["translations_file"] == os.path.join(out, "test.latest.step400.beam1.alpha0.6.txt")
  # "0300" is step 300: the same evaluation, not a second one beside it.
  assert evaluate_test(split="test", checkpoint="0300") == split
  # eval.py's decode budget: another evaluation, with its budget on record.
  short = evaluate_test(split="test", max_decode_len=3)
  assert short["max_decode_len"] == 3
  assert short["translations_file"] == os.path.join(out, "test.step300.beam1.alpha0.6.2.txt")


def test_a_split_stored_out_of_file_order_gets_its_sources_beside(run, tmp_path, monkeypatch,
                                                                  caplog):
  """WMT14's catalog builder lets TFDS shuffle its splits: the translations cannot be paired
  with newstest2014's lines, so the sources are written beside them, line by line."""
  config, workdir, _ = run
  task = pipeline.get_task(config.task)
  monkeypatch.setattr(task, "in_file_order", False)
  result = evaluate.evaluate_checkpoint(workdir, checkpoint=300, split="test", beam_size=1,
                                        output_dir=str(tmp_path))
  stem = result["translations_file"][:-len(".txt")]
  assert result["sources_file"] == stem + ".sources.txt"
  assert evaluate.read_sentences(result["sources_file"]) == task.source_texts("test")
  assert f"follow the order TFDS stored it in, not its files' line order; {stem}.sources.txt" in (
      caplog.text)
  monkeypatch.setattr(task, "in_file_order", True)
  again = evaluate.evaluate_checkpoint(workdir, checkpoint=300, split="test", beam_size=1,
                                       output_dir=str(tmp_path / "in_order"))
  assert "sources_file" not in again and not any(
      name.endswith(".sources.txt") for name in os.listdir(tmp_path / "in_order"))


def test_an_output_folder_that_cannot_be_written_stops_before_any_work(run, tmp_path, monkeypatch):
  _, workdir, _ = run
  monkeypatch.setattr(evaluate, "restore_model", lambda *args: pytest.fail("restored"))
  blocker = tmp_path / "file"
  blocker.write_text("", encoding="utf-8")
  with pytest.raises(
      OSError,
      match=(rf"^eval output folder {blocker}/eval cannot be written \(Not a directory\): pass "
             r"another --output_dir\.$")):
    evaluate.evaluate_checkpoint(workdir, split="test", output_dir=str(blocker / "eval"))


def test_translations_cut_at_the_decode_budget_are_counted_in_a_warning(caplog):
  """A model that never ends a sentence: every translation reaches the budget and is cut there,
  as the warning says; one that ends at once cuts none."""
  tokenizer = tokenizer_lib.train_tokenizer(
      ["the dog sees the cat", "a small bird sings near the river"] * 50, vocab_size=64,
      model_type="unigram", seed=0)
  config = tiny.get_config()
  config.model.logits_via_embedding = False
  config.decode.max_decode_len = 5
  validated = run_config.validate(config)
  model = model_lib.build_model(validated.model, seed=0)
  texts = ["the dog sees the cat", "a bird", "the river"]
  for eos_bias, cut in ((-50.0, 3), (50.0, 0)):
    model.decoder.logits.bias[tokenizer_lib.EOS_ID] = eos_bias
    caplog.clear()
    evaluate.translate_texts(model, tokenizer, texts, validated, mesh=device_mesh.make_mesh())
    warned = [r.getMessage() for r in caplog.records if "decode budget" in r.getMessage()]
    assert warned == ([
        "3 of 3 translations reached the decode budget (5 tokens: decode.max_decode_len, else 2 x "
        "the batch's padded source length + 10, at most model.max_len) without ending: they are "
        "cut there."
    ] if cut else [])


def test_the_python_api_page_restores_and_translates_as_eval_py_does(run, tmp_path):
  """docs/api.md's "A trained run in Python" block, run on a trained workdir."""
  _, workdir, _ = run
  with open(os.path.join(ROOT, "docs", "api.md"), encoding="utf-8") as f:
    page = f.read()
  section = page.split("## A trained run in Python", 1)[1]
  code = section.split("```python\n", 1)[1].split("```", 1)[0]
  assert 'workdir = "runs/rel_k"\n' in code
  namespace = {}
  exec(code.replace('"runs/rel_k"', repr(workdir)), namespace)  # pylint: disable=exec-used
  result = evaluate.evaluate_checkpoint(workdir, checkpoint="best", split="test",
                                        output_dir=str(tmp_path))
  assert namespace["step"] == result["step"]
  with open(result["translations_file"], encoding="utf-8") as f:
    assert namespace["translations"] == f.read().splitlines()[:2]
