r"""BLEU of a synthetic-task run's test translations on the subsets that say what its held-out
splits hold (docs/length.md):

- `test`: the pairs that also occur in the training split (the grammar repeats short sentences;
  generated from other seeds, about one test pair in ten is a training pair) and those that do
  not;
- `test_long`: by construction (`synthetic.long_sentence_construction`). Training sentences
  (at most `task.synthetic.max_words` = 12 words) never join two clauses with "and" ("ke" in
  the target) and never hold two relative clauses, so a `test_long` sentence that does holds a
  construction the model has never seen, besides its length; the others ("seen
  constructions": one clause, at most one relative clause) test length alone.

  python -m relpos.experiments.synthetic_subsets --workdirs=W1,W2,... [--checkpoint=best]

reads each run's config.json, generates its task's splits again (`relpos.data.synthetic`), and
scores the translations that its evaluation of `test` and `test_long` left in `WORKDIR/eval/`
(a table's final evaluation leaves them; else `python eval.py --workdir=W --split=test_long
--checkpoint=best`), with the run's beam settings. Before scoring a subset it checks that the
whole split's BLEU equals the one the evaluation recorded, so translations and pairs line up.
"""
import dataclasses
import glob
import math
import os
from collections.abc import Sequence

from absl import app
from absl import logging
from absl import flags

from relpos import cli
from relpos import json_files
from relpos import run_config
from relpos import scoring
from relpos import workdir_files
from relpos.data import synthetic
from relpos.experiments import diagnostics
from relpos.experiments import markdown

SPLITS = ("test", "test_long")

_WORKDIRS = flags.DEFINE_list("workdirs", None,
                              "Runs of the synthetic task, evaluated on test and test_long.",
                              required=True)
_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", None, "The checkpoint whose evaluation to score "
    "(default: the run's decode.checkpoint, what a table scores).")


@dataclasses.dataclass(frozen=True)
class Subset:
  """BLEU of one subset of a split's sentences."""
  name: str
  num_sentences: int
  bleu: float | None  # None for an empty subset


def evaluation(workdir: str, split: str, checkpoint: str, decode: dict) -> tuple[dict, list[str]]:
  """The evaluation JSON of `split` at `checkpoint` with the run's beam settings in
  `workdir/eval/`, and its translations [sentences]. Of several (an eval.py of "best" while the
  run trained, then the table's final evaluation), the one written last: that of the
  checkpoint's final step; a warning names the others.

  Raises:
    FileNotFoundError: none, naming the eval.py command that makes it.
  """
  eval_dir = os.path.join(workdir, workdir_files.EVAL_DIR)
  found = []
  for path in glob.glob(os.path.join(eval_dir, f"{split}.*.json")):
    result = json_files.read_json(path)
    if (result.get("split"), str(result.get("checkpoint")), result.get("beam_size"),
        result.get("alpha")) == (split, checkpoint, decode["beam_size"], decode["alpha"]):
      found.append((os.path.getmtime(path), path, result))
  if not found:
    raise FileNotFoundError(
        f"{eval_dir} holds no evaluation of {split} at checkpoint {checkpoint} with beam "
        f"{decode['beam_size']}, alpha {decode['alpha']}: run python eval.py --workdir={workdir} "
        f"--split={split} --checkpoint={checkpoint}.")
  *older, (_, path, result) = sorted(found)
  if older:
    logging.warning(
        "Scoring %s (step %s), the newest evaluation of %s at checkpoint %s; older: %s.", path,
        result.get("step"), split, checkpoint,
        ", ".join(f"{p} (step {r.get('step')})" for _, p, r in older))
  with open(path[:-len(".json")] + ".txt", encoding="utf-8") as f:  # written beside it
    return result, f.read().split("\n")[:result["num_sentences"]]


def run_subsets(workdir: str, checkpoint: str | None = None) -> dict[str, list[Subset]]:
  """Per split of `SPLITS`, the whole split ("all") and its subsets, scored.

  Raises:
    ValueError: the run is not of the synthetic task, or its translations do not line up with
      the generated split (their BLEU differs from the one recorded).
    FileNotFoundError: as `evaluation`, or the workdir or its config.json is missing.
  """
  config = run_config.load(workdir)
  if config.task.name != "synthetic":
    raise ValueError(f"{workdir} is a run of task {config.task.name!r}: the subsets are those "
                     "of the synthetic task.")
  splits = synthetic.SyntheticParams.of(config.task).splits()
  train_pairs = set(splits["train"])
  language = config.task.target_lang
  checkpoint = checkpoint or config.decode.checkpoint
  scored = {}
  for split in SPLITS:
    recorded, hypotheses = evaluation(workdir, split, checkpoint, config.decode.to_dict())
    pairs = splits[split]
    whole = scoring.score(hypotheses, [target for _, target in pairs], language=language)["bleu"]
    if len(hypotheses) != len(pairs) or not math.isclose(whole, recorded["bleu"], abs_tol=1e-6):
      raise ValueError(
          f"the {split} translations in {workdir}/eval do not line up with the {split} "
          f"split generated from {workdir}/config.json (BLEU {whole:.2f} against "
          f"the {recorded['bleu']:.2f} recorded).")
    by_subset = diagnostics.bleu_by_subset(hypotheses, [target for _, target in pairs],
                                           synthetic.subsets_of(split, pairs, train_pairs),
                                           language)
    scored[split] = [Subset("all", len(pairs), whole)] + [
        Subset(name, subset["num_sentences"], subset["bleu"]) for name, subset in by_subset.items()
    ]
  return scored


def markdown_lines(by_run: dict[str, dict[str, list[Subset]]]) -> list[str]:
  """One table per split: a row per run, a column per subset ("BLEU (sentences)")."""
  lines = []
  for split in SPLITS:
    names = list(dict.fromkeys(s.name for run in by_run.values() for s in run[split]))
    rows = []
    for workdir, run in by_run.items():
      cells = {s.name: s for s in run[split]}
      rows.append([workdir] + [
          f"{cells[n].bleu:.1f} ({cells[n].num_sentences})"
          if n in cells and cells[n].bleu is not None else "–" for n in names
      ])
    lines += [f"{split} BLEU (sentences):", "", *markdown.table(["run", *names], rows), ""]
  return lines


def main(argv: Sequence[str]) -> None:
  by_run = cli.run(argv, lambda: {w: run_subsets(w, _CHECKPOINT.value) for w in _WORKDIRS.value})
  print("\n".join(markdown_lines(by_run)))


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
