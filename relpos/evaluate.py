"""Evaluation: restore a checkpoint, translate a split or a file with beam search, score it.

`score_split` is the one code path for BLEU: training's periodic validation calls it, and so
does `evaluate_checkpoint` (eval.py), which therefore reproduces the in-training numbers.

Every sentence is translated: sources are batched by length and padded to a length bucket,
never filtered or truncated (sources longer than training's are translated too), and each
batch may decode up to 2 * (its padded source length) + 10 tokens (capped at `model.max_len`;
or `decode.max_decode_len` when set). Scores (`relpos.scoring`) are sacreBLEU (cased, 13a
tokenization; and lower-cased) and chrF on detokenized output (`Tokenizer.decode`) against the
raw reference text, with their signatures, and BLEU of lower-cased Moses-tokenized text as much
of the literature reports it. An input file whose line has more than MAX_SOURCE_TOKENS tokens
is refused before any work, naming the line: its batch's encoder attention grows with the
square of its length (a 5,000-word line asked for 123 GB), and a sentence-level model cannot
translate a document in one piece anyway.

A run is rebuilt from `workdir/config.json` (data, never code) and its Orbax checkpoint; the
modules it imported with --import (named in `workdir/imports.json`, never code from the
workdir itself) are imported first.
"""
import functools
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
import tqdm
from absl import logging
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from relpos import checkpoint_schedule
from relpos import checkpoints
from relpos import decode
from relpos import distributed
from relpos import device_mesh
from relpos import evaluation_files
from relpos import metrics_writer
from relpos import run_config
from relpos import scoring
from relpos import user_modules
from relpos import workdir_files
from relpos.data import pipeline
from relpos.data import tokenizer as tokenizer_lib

# Source lengths are padded up to a multiple of this, bounding the number of compilations.
LENGTH_BUCKET = 16
# The longest source (in tokens, with its EOS) an input file may hold: its batch's attention
# logits are then at most eval_batch_size * heads * 2048^2 floats a layer (4 GB at 64 x 4).
MAX_SOURCE_TOKENS = 2048


def max_decode_len(source_length: int, decode_config: ml_collections.ConfigDict,
                   model_max_len: int) -> int:
  """Decode budget of a batch whose sources have at most `source_length` tokens."""
  if decode_config.max_decode_len:
    return decode_config.max_decode_len
  return min(2 * source_length + 10, model_max_len)


def source_batches(tokenizer: tokenizer_lib.Tokenizer, texts: Sequence[str], batch_size: int,
                   max_len: int | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """Tokenized sources in batches of similar length; none dropped or truncated.

  Args:
    tokenizer: encodes a text to ids ending with EOS.
    texts: the sources.
    batch_size: rows per batch (the last batch is filled with one-token EOS rows).
    max_len: model.max_len: a batch whose sources fit it is padded no further (a learned
      absolute table has no position beyond it).

  Yields:
    (example_index int32 [batch_size], -1 on filler rows;
     inputs int32 [batch_size, length], length a multiple of LENGTH_BUCKET (or `max_len`),
     PAD_ID padded).
  """
  encoded = [tokenizer.encode(text) for text in texts]
  order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
  for start in range(0, len(order), batch_size):
    rows = order[start:start + batch_size]
    longest = max(len(encoded[i]) for i in rows)
    length = -(-longest // LENGTH_BUCKET) * LENGTH_BUCKET
    if max_len and longest <= max_len:
      length = min(length, max_len)
    inputs = np.full((batch_size, length), tokenizer_lib.PAD_ID, np.int32)
    inputs[len(rows):, 0] = tokenizer_lib.EOS_ID
    for row, i in enumerate(rows):
      inputs[row, :len(encoded[i])] = encoded[i]
    example_index = np.full((batch_size,), -1, np.int32)
    example_index[:len(rows)] = rows
    yield example_index, inputs


def translate_texts(model: nnx.Module, tokenizer: tokenizer_lib.Tokenizer, texts: Sequence[str],
                    config: run_config.RunConfig, *, mesh: Mesh,
                    lengths: Sequence[int] | None = None) -> list[str]:
  """Translates every text with beam search (greedy when decode.beam_size is 1).

  Args:
    model: a Transformer.
    tokenizer: the task's tokenizer (encode sources, decode outputs).
    texts: the sources.
    config: the run config (decode.*, model.max_len, train.eval_batch_size: rounded up to a
      multiple of the mesh's devices).
    mesh: devices the batch rows are split over.
    lengths: None, or each output's length in tokens, eos included (at most model.max_len):
      eos is forbidden before it and forced at it (oracle-length decoding, `decode.translate`).

  Returns:
    The detokenized translations, in the order of `texts`.

  Batches run longest first. A progress bar (sentences translated, rate and time left) goes to
  stderr on process 0; it leaves no line behind. Translations that reach the decode budget
  without ending are cut there and scored so, with a warning that counts them.
  """
  sharding = NamedSharding(mesh, PartitionSpec(device_mesh.DATA_AXIS))
  translations: list[str] = [""] * len(texts)
  progress = tqdm.tqdm(total=len(texts), unit="sentence", desc="translating", leave=False,
                       dynamic_ncols=True, disable=jax.process_index() != 0)
  cut, budgets = 0, set()
  # Rows split evenly over the devices, however many this machine has: a run trained on one
  # count is evaluated on another (filler rows make up the difference).
  batch_size = -(-config.train.eval_batch_size // mesh.size) * mesh.size
  # The longest batch first: what cannot run (no memory for it, a learned table too short for
  # its sources) stops before any other work, not after it. The same batches, so the same
  # translations.
  batches = list(source_batches(tokenizer, texts, batch_size, config.model.max_len))
  for example_index, inputs in reversed(batches):
    rows = {"inputs": inputs}
    budget = max_decode_len(inputs.shape[1], config.decode, config.model.max_len)
    if lengths is not None:  # filler rows: eos first
      rows["lengths"] = np.array([lengths[i] if i >= 0 else 1 for i in example_index], np.int32)
      longest = -(-int(rows["lengths"].max()) // LENGTH_BUCKET) * LENGTH_BUCKET  # few compiles
      budget = max(budget, min(longest, config.model.max_len))
    local = {
        k: jax.make_array_from_process_local_data(sharding, v)
        for k, v in device_mesh.process_rows(rows).items()
    }
    bounds = ({"min_len": local["lengths"], "max_len": local["lengths"]}
              if lengths is not None else {})
    tokens = decode.translate(model, local["inputs"], beam_size=config.decode.beam_size,
                              alpha=config.decode.alpha, max_decode_len=budget,
                              eos_id=tokenizer_lib.EOS_ID, output_vocab_size=tokenizer.vocab_size,
                              **bounds)
    tokens = np.asarray(multihost_utils.process_allgather(tokens, tiled=True))
    for i, row in zip(example_index, tokens):
      if i >= 0:
        translations[i] = tokenizer.decode(row.tolist())
        if tokenizer_lib.EOS_ID not in row:
          cut, budgets = cut + 1, budgets | {budget}
    progress.update(int(np.sum(example_index >= 0)))
  progress.close()
  if cut:
    logging.warning(
        "%d of %d translations reached the decode budget (%s tokens: decode.max_decode_len, "
        "else 2 x the batch's padded source length + 10, at most model.max_len) without "
        "ending: they are cut there.", cut, len(texts), ", ".join(map(str, sorted(budgets))))
  return translations


def score_split(model: nnx.Module, task: pipeline.Task, split: str, config: run_config.RunConfig, *,
                mesh: Mesh) -> dict[str, Any]:
  """Translates a whole split (decode.* of `config`) and scores it against its references
  (warning, once per split, of references the tokenizer cannot write: `Task.check_references`).

  Returns:
    `scoring.score`'s dict plus "translations" (list of str, in split order).
  """
  task.check_references(split)
  translations = translate_texts(model, task.tokenizer, task.source_texts(split), config, mesh=mesh)
  scores = scoring.score(translations, task.target_texts(split), language=config.task.target_lang)
  return {**scores, "translations": translations}


def read_sentences(path: str, what: str = "source") -> list[str]:
  """The lines of a UTF-8 text file (one sentence a line, final newline optional). A leading
  byte-order mark and Windows line ends (CRLF) are not part of a sentence: left in, a BOM would
  lower the first reference's BLEU (66.9 instead of 100 for an identical 5-word sentence).

  Args:
    path: the file.
    what: what its lines are ("source", "reference", "translation"), for the error messages.

  Raises:
    FileNotFoundError: no such file.
    ValueError: the file is not UTF-8 (naming the byte offset), is empty, or holds a carriage
      return that does not end a line (naming the line).
  """
  with open(path, "rb") as f:
    data = f.read()
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise ValueError(f"{path} is not UTF-8 text: byte {e.start} is "
                     f"{data[e.start:e.start + 1]!r} ({e.reason}).") from None
  lines = text.removeprefix("\ufeff").replace("\r\n", "\n").split("\n")
  if lines[-1] == "":
    lines.pop()
  for number, line in enumerate(lines, 1):
    if "\r" in line:  # old Mac line ends: a whole file would read as one sentence
      raise ValueError(f"{path} line {number} holds a carriage return (\\r) inside it: one "
                       f"{what} sentence a line, ended by \\n or \\r\\n.")
  if not lines:
    raise ValueError(f"{what} file {path} is empty: one {what} sentence a line is needed.")
  return lines


def check_source_lengths(path: str, sources: Sequence[str],
                         tokenizer: tokenizer_lib.Tokenizer) -> None:
  """Refuses an input file holding a source longer than MAX_SOURCE_TOKENS tokens.

  Raises:
    ValueError: naming the file, the first such line (1-based), its length and the limit.
  """
  for line, text in enumerate(sources, start=1):
    length = len(tokenizer.encode(text))
    if length > MAX_SOURCE_TOKENS:
      raise ValueError(f"{path}:{line} has {length} tokens, more than the {MAX_SOURCE_TOKENS} "
                       f"a source may have: split it into sentences, one a line.")


AVERAGE_PREFIX = "average:"


def average_parameters(models: Iterable[nnx.Module]) -> nnx.Module:
  """The last of `models` with every parameter replaced by its mean over `models` (checkpoint
  averaging, as in Vaswani et al. 2017, fairseq and OpenNMT). Summed one model at a time, in
  order: given a generator, two models' parameters are held at once, not N."""
  total, count, last = None, 0, None
  for last in models:
    params = nnx.state(last, nnx.Param)
    total = params if total is None else jax.tree.map(lambda a, b: a + b, total, params)
    count += 1
  if last is None:
    raise ValueError("average_parameters needs at least one model.")
  nnx.update(last, jax.tree.map(lambda value: value / count, total))
  return last


def _average_count(checkpoint: str | int) -> int | None:
  """N of "average:N" (N >= 2), None for any other checkpoint name."""
  if not (isinstance(checkpoint, str) and checkpoint.startswith(AVERAGE_PREFIX)):
    return None
  count = run_config.averaged_count(checkpoint)
  if not count:
    raise ValueError(f"checkpoint={checkpoint!r}: average:<N> needs an integer N >= 2.")
  return count


def averaged_steps(workdir: str, steps: Sequence[int], train_config: ml_collections.ConfigDict,
                   count: int) -> list[int]:
  """The steps "average:`count`" averages: the last `count` of the checkpoint schedule
  (`checkpoint_schedule.scheduled_steps`) up to the newest scheduled checkpoint of `steps`,
  the checkpoints held.

  Raises:
    FileNotFoundError: the run has not saved `count` on schedule yet, or one of them is not
      held (fewer kept, or an older best checkpoint kept in their place), naming the missing
      steps: an average of the others would not be the one asked for.
  """
  held = checkpoint_schedule.scheduled_steps(steps, train_config)
  newest = held[-1] if held else 0
  schedule = checkpoint_schedule.scheduled_steps(range(1, newest + 1), train_config)[-count:]
  missing = sorted(set(schedule) - set(held))
  if len(schedule) < count:
    raise FileNotFoundError(
        f"checkpoint=average:{count}: the run in {workdir} has saved {len(schedule)} checkpoints "
        f"on schedule up to its newest, step {newest}; average fewer.")
  if missing:
    raise FileNotFoundError(
        f"checkpoint=average:{count}: {workdir} lacks steps {missing} of the last {count} "
        f"checkpoints saved on schedule up to step {newest} (it holds {held}); keep more with "
        f"train.keep_checkpoints.")
  return schedule


def restore_model(workdir: str, config: run_config.RunConfig, checkpoint: str | int,
                  mesh: Mesh) -> tuple[nnx.Module, int]:
  """The model saved in `workdir` at `checkpoint`, and its step.

  `checkpoint` is "latest", "best", a step, or "average:N": the parameters of the last N
  checkpoints saved on schedule averaged (`checkpoint_schedule.scheduled_steps`; the step
  returned is the last of them). "latest" is the newest checkpoint that restores: damaged newer
  ones are skipped with a warning naming what is wrong and the step restored instead.

  Raises:
    FileNotFoundError: no checkpoint (or not that step) in the workdir.
    ValueError: the checkpoint's parameters do not fit the config (naming the first one).
    checkpoint_damage.DamagedCheckpointError: the checkpoint asked for (every one, for "latest")
      is damaged.
  """
  manager = checkpoints.make_manager(workdir, read_only=True)
  restore_step = functools.partial(checkpoints.restore_model, manager, model_config=config.model,
                                   sharding=NamedSharding(mesh, PartitionSpec()))
  try:
    average = _average_count(checkpoint)
    if average is not None:
      checkpoints.resolve_step(manager, "latest")  # says so when no checkpoint is ready
      steps = [
          checkpoints.agreed(s)
          for s in averaged_steps(workdir, manager.all_steps(), config.train, average)
      ]
      logging.info("Averaging the parameters of steps %s.", steps)
      return average_parameters(restore_step(s) for s in steps), steps[-1]
    if checkpoint != "latest":
      step = checkpoints.agreed(checkpoints.resolve_step(manager, checkpoint))
      return restore_step(step), step
    step, model, damaged = checkpoints.restore_newest(manager, restore_step)
  finally:
    manager.close()
  if damaged:
    logging.warning("Evaluating step %d: the newer checkpoints %s are damaged.", step, damaged)
  return model, step


def _file_sentences(input_file: str,
                    reference_file: str | None) -> tuple[list[str], list[str] | None]:
  """(sources, references or None) of an input file and its optional reference file.

  Raises:
    ValueError: a file that is empty, a source file of blank lines only, or references that do
      not pair with the sources line by line.
  """
  sources = read_sentences(input_file)
  if not any(line.strip() for line in sources):
    raise ValueError(f"source file {input_file} holds blank lines only: there is no sentence to "
                     f"translate.")
  if reference_file is None:
    return sources, None
  references = read_sentences(reference_file, "reference")
  if len(references) != len(sources):
    raise ValueError(f"{reference_file} has {len(references)} lines but {input_file} has "
                     f"{len(sources)}: one reference per source line is needed.")
  return sources, references


def evaluate_checkpoint(workdir: str, *, checkpoint: str | int = "latest", split: str | None = None,
                        input_file: str | None = None, reference_file: str | None = None,
                        beam_size: int | None = None, alpha: float | None = None,
                        max_decode_len: int | None = None,
                        output_dir: str | None = None) -> dict[str, Any]:
  """Restores a checkpoint, translates a split or a file, writes and returns the scores.

  Args:
    workdir: a training workdir (config.json + checkpoints/).
    checkpoint: "latest", "best" (by validation BLEU), a step number or "average:N" (the last
      N checkpoints' parameters averaged).
    split: a split of the run's task, e.g. "validation" or "test" (or give input_file).
    input_file: UTF-8 text, one source sentence a line.
    reference_file: references for input_file, one a line (scores need them).
    beam_size: overrides decode.beam_size of the run.
    alpha: overrides decode.alpha of the run.
    max_decode_len: overrides decode.max_decode_len of the run (the most target tokens a
      translation may have; 0: 2 x the batch's padded source length + 10, at most
      model.max_len).
    output_dir: where `<name>.txt` (translations) and `<name>.json` (results) go, <name> from
      `evaluation_files.output_name` (split or input file, checkpoint choice, step, beam,
      alpha); default `workdir/eval`. Outputs of another evaluation under that name are kept:
      the new ones get a free name (`evaluation_files.output_stem`). Both files are written
      whole or not at all;
      a split stored in another order than its files' (WMT14) also gets its sources written.

  Returns:
    {"step", "checkpoint", "beam_size", "alpha", "max_decode_len", "num_sentences",
    "translations_file", "workdir", "split", "input_file", "reference_file"} (absolute paths,
    None where not given) plus, with references, "bleu", "signature", "chrf", "chrf_signature".

  Raises:
    FileNotFoundError: missing workdir, config.json, checkpoint or input file.
    OSError: an output folder that cannot be written (before any work).
    ValueError: invalid arguments, an empty or non-UTF-8 input file or one with a line over
      MAX_SOURCE_TOKENS tokens, a checkpoint of another architecture, a position variant of
      the user's own that fails a trial (`variant_trial.check_variant`).
  """
  config = run_config.load(workdir)
  decoding = {
      "decode.beam_size": beam_size, "decode.alpha": alpha, "decode.max_decode_len": max_decode_len
  }
  config = run_config.replace(config, {k: v for k, v in decoding.items() if v is not None})
  if (split is None) == (input_file is None):
    raise ValueError(f"give exactly one of split (--split) and input_file (--input); got "
                     f"split={split!r}, input_file={input_file!r}.")
  if split is not None and reference_file is not None:
    raise ValueError(f"reference_file (--reference) goes with input_file (--input): split "
                     f"{split!r} is scored against its own references.")
  if not (isinstance(checkpoint, int) or str(checkpoint).isdigit() or
          run_config.CHECKPOINT_CHOICE.fullmatch(str(checkpoint))):
    raise ValueError(f"checkpoint={checkpoint!r}: must be 'latest', 'best', a step number or "
                     f"'average:<N>' with N >= 2.")
  if str(checkpoint).isdigit():  # "00012" is step 12: one evaluation, one name
    checkpoint = int(checkpoint)
  # Before the data is prepared; then against the splits the prepared data holds.
  pipeline.check_split(split, config.task.name, pipeline.split_names(config.task))
  task = pipeline.get_task(config.task)
  metrics_writer.check_tokenizer(workdir, task.tokenizer.sha256(), task.tokenizer.path)
  user_modules.warn_of_edited_variant(metrics_writer.read_starts(workdir), config.model.position,
                                      "evaluating with the file as it is")
  pipeline.check_split(split, config.task.name, task.splits)
  if input_file is not None:  # Bad files fail before any work.
    sources, references = _file_sentences(input_file, reference_file)
    check_source_lengths(input_file, sources, task.tokenizer)
    if references is not None:
      tokenizer_lib.check_references(task.tokenizer, references, reference_file)
  output_dir = output_dir or os.path.join(workdir, workdir_files.EVAL_DIR)
  distributed.on_process_0(lambda: evaluation_files.check_writable(output_dir),
                           f"checking that {output_dir} can be written")
  mesh = device_mesh.make_mesh()
  model, step = restore_model(workdir, config, checkpoint, mesh)
  if split is not None:
    scores = score_split(model, task, split, config, mesh=mesh)
    translations = scores.pop("translations")
    sources = sources_to_write(task, split)
  else:
    translations = translate_texts(model, task.tokenizer, sources, config, mesh=mesh)
    scores = ({} if references is None else scoring.score(translations, references,
                                                          language=config.task.target_lang))
    sources = None  # the input file holds them, in the translations' order
  return evaluation_files.write_evaluation(output_dir, workdir, config, checkpoint, step,
                                           translations, scores, split=split, input_file=input_file,
                                           reference_file=reference_file, sources=sources)


def sources_to_write(task: pipeline.Task, split: str) -> list[str] | None:
  """A split's sources, to write beside its translations (`evaluation_files.write_evaluation`)
  where its stored order is not its files' line order (`Task.in_file_order`: WMT14); None where
  it is."""
  return None if task.in_file_order else task.source_texts(split)
