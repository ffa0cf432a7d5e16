"""What an evaluation writes: `<stem>.txt` (one translation a line) and `<stem>.json` (what was
evaluated and its scores), and `<stem>.sources.txt` for a split stored in another order than its
files' (WMT14); each written whole or not at all, from process 0.

eval.py (`relpos.evaluate.evaluate_checkpoint`) and a table's final evaluation
(`relpos.experiments.single_run`) write the same files; <stem> is `output_name`'s name in the
output folder, or a free variant of it when that folder holds another evaluation under the name
(`output_stem`): an output is replaced only by the same evaluation run again.
"""

import itertools
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
from absl import logging

from relpos import json_files
from relpos import run_config


def check_writable(output_dir: str) -> None:
  """Checks that a file can be written in `output_dir`, before any work, creating nothing: a
  missing folder is probed in its nearest existing ancestor (a refused evaluation leaves no
  empty eval/ behind; `write_evaluation` creates the folder).

  Raises:
    OSError: naming the folder, the reason and what to do.
  """
  folder = os.path.abspath(output_dir)
  while not os.path.lexists(folder):
    folder = os.path.dirname(folder)
  probe = os.path.join(folder, f".write_test.{os.getpid()}")
  try:
    with open(probe, "w", encoding="utf-8"):
      pass
    os.remove(probe)
  except OSError as e:
    reason = e.strerror or type(e).__name__
    raise OSError(f"eval output folder {output_dir} cannot be written ({reason}): pass another "
                  "--output_dir.") from None


def output_name(what: str, checkpoint: str | int, step: int, beam_size: int, alpha: float) -> str:
  """The name (without .txt / .json) of an evaluation's outputs:
  `<what>[.<choice>].step<step>.beam<beam>.alpha<alpha>`.

  Args:
    what: the split, or "input-<file name>" for an input file.
    checkpoint: the checkpoint asked for: "latest", "best" or "average:N" (written "averageN")
      name a choice; a step number names none (the step says it).
    step: the step evaluated (the last averaged one for "average:N").
    beam_size, alpha: of the beam search.
  """
  choice = "" if isinstance(checkpoint, int) or str(checkpoint).isdigit() else (
      "." + str(checkpoint).replace(":", ""))
  return f"{what}{choice}.step{step}.beam{beam_size}.alpha{alpha}"


# Beside `<stem>.txt`: the sources of a split stored in another order than its files'.
SOURCES_SUFFIX = ".sources.txt"

# The fields of an evaluation's results that say what was evaluated: an output of the same
# name whose JSON differs in one of them (or that has none) is another evaluation.
IDENTITY_FIELDS = ("workdir", "checkpoint", "step", "split", "input_file", "reference_file",
                   "beam_size", "alpha", "max_decode_len")


def _same_evaluation(json_path: str, identity: dict[str, Any]) -> bool:
  """Whether `json_path` holds the results of the evaluation `identity` describes."""
  try:
    saved = json_files.read_json(json_path)
  except (OSError, ValueError):
    return False
  return isinstance(saved, dict) and all(k in saved and saved[k] == v for k, v in identity.items())


def taken_stems(stem: str) -> Iterator[str]:
  """`stem`, `stem.2`, `stem.3`, ... while outputs are written under them: the names an
  evaluation named `stem` went to (`output_stem` takes the first that is free or its own)."""
  for candidate in itertools.chain([stem], (f"{stem}.{n}" for n in itertools.count(2))):
    if not any(os.path.exists(candidate + ext) for ext in (".txt", ".json", SOURCES_SUFFIX)):
      return
    yield candidate


def output_stem(output_dir: str, name: str, identity: dict[str, Any]) -> str:
  """The path (without .txt / .json) the outputs of an evaluation go to: `output_dir/name`,
  or, when that holds another evaluation's outputs, the first free `output_dir/name.<n>` (n >= 2),
  with a warning: an output is replaced only by the same evaluation run again."""
  stem = os.path.join(output_dir, name)
  taken = list(taken_stems(stem))
  candidate = next((c for c in taken if _same_evaluation(c + ".json", identity)),
                   f"{stem}.{len(taken) + 1}" if taken else stem)
  if candidate != stem:
    logging.warning("%s.json holds another evaluation; writing %s.json and .txt instead.", stem,
                    candidate)
  return candidate


def write_evaluation(output_dir: str, workdir: str, config: run_config.RunConfig,
                     checkpoint: str | int, step: int, translations: Sequence[str],
                     scores: Mapping[str, Any], *, split: str | None = None,
                     input_file: str | None = None, reference_file: str | None = None,
                     sources: Sequence[str] | None = None) -> dict[str, Any]:
  """Writes an evaluation's outputs, `<stem>.txt` (one translation a line) then `<stem>.json`
  (what was evaluated, `IDENTITY_FIELDS`, and `scores`), each whole or not at all, from process
  0; <stem> is `output_stem(output_dir, output_name(...))`. The same files whether eval.py or a
  table's final evaluation made them.

  Args:
    output_dir: the folder (created if missing).
    workdir, config: the run evaluated, with the decoding used.
    checkpoint, step: the checkpoint asked for and the step it restored.
    translations: the outputs, in input order.
    scores: `scoring.score`'s dict ({} without references).
    split / input_file, reference_file: what was translated (one of split and input_file).
    sources: the sources of `translations`, line by line, written to `<stem>.sources.txt`
      (`sources_to_write`: a split stored in another order than its files', whose translations
      cannot be paired with the files' lines).

  Returns:
    The results written to `<stem>.json`, with "num_sentences" and "translations_file" (and
    "sources_file" with `sources`), absolute paths as the workdir's.
  """
  output_dir = os.path.abspath(output_dir)
  identity = {
      "workdir": os.path.abspath(workdir), "checkpoint": str(checkpoint), "step": step,
      "split": split, "input_file": input_file and os.path.abspath(input_file),
      "reference_file": reference_file and os.path.abspath(reference_file),
      "beam_size": config.decode.beam_size, "alpha": config.decode.alpha,
      "max_decode_len": config.decode.get("max_decode_len", 0)
  }
  what = split if split is not None else "input-" + os.path.basename(input_file)
  stem = output_stem(
      output_dir, output_name(what, checkpoint, step, config.decode.beam_size, config.decode.alpha),
      identity)
  results = {
      **identity, "num_sentences": len(translations), "translations_file": stem + ".txt", **scores
  }
  if sources is not None:
    results["sources_file"] = stem + SOURCES_SUFFIX
  if jax.process_index() == 0:
    os.makedirs(output_dir, exist_ok=True)
    if sources is not None:
      logging.warning(
          "%s.txt: the translations of split %r follow the order TFDS stored it in, not its "
          "files' line order; %s holds each line's source (to keep a file's order, translate "
          "it with --input).", stem, split, results["sources_file"])
      json_files.write_text(results["sources_file"], "".join(s + "\n" for s in sources))
    json_files.write_text(stem + ".txt", "".join(t + "\n" for t in translations))
    json_files.write_json(stem + ".json", results, indent=2)
  return results
