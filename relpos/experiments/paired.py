"""Paired bootstrap over the test sentences, seed by seed: whether a run's BLEU differs from that
of its table's baseline row with the same seed by more than the choice of test sentences alone
moves it (Koehn 2004; sacreBLEU's `--paired-bs`). Welch's t-test over seeds
(`relpos.experiments.verdicts`) measures how much BLEU moves between trainings; this measures how
much it moves between test sets, from two runs' translations of one split.

Each finished run's translations are in its eval/ folder
(`relpos.evaluation_files.write_evaluation`; written back there for a run restored from a
published table). `annotate` adds to each run of `results.json` that has a baseline partner:

  "paired_bootstrap": {split: {"against": the partner's run name, "against_row": its row,
                               "bleu", "baseline_bleu", "difference" (bleu - baseline_bleu),
                               "p_value", "signature"}}
"""

import math
import os
from collections.abc import Sequence
from typing import Any

from absl import logging
from sacrebleu import significance
from sacrebleu.metrics import BLEU

from relpos import evaluate
from relpos import evaluation_files
from relpos import json_files
from relpos import run_config
from relpos import workdir_files
from relpos.data import pipeline
from relpos.experiments import tables
from relpos.experiments import verdicts

# Resamples of the test sentences (sacreBLEU's default for --paired-bs). Their random seed is
# sacreBLEU's (12345 unless SACREBLEU_SEED says otherwise; the signature names it).
NUM_SAMPLES = 1000


def paired_bootstrap(references: Sequence[str], baseline: Sequence[str],
                     systems: Sequence[Sequence[str]]) -> list[dict[str, Any]]:
  """sacreBLEU's paired bootstrap of each of `systems` against `baseline` (cased BLEU, 13a).

  Args:
    references, baseline: [sentences] the references and the baseline's translations.
    systems: [systems][sentences] translations of the same sentences.

  Returns:
    Per system: {"bleu", "baseline_bleu", "difference", "p_value", "signature"}. p is two-sided:
    (1 + the number of resamples whose absolute difference, less its mean over the resamples,
    exceeds the observed one) / (1 + resamples), as Moses' bootstrap-hypothesis-difference-
    significance.pl; the signature names the number of resamples and their seed. A system
    whose BLEU equals the baseline's gets p = 1: where every resample's difference is 0 too
    (the same translations, or two that score 0 on every resample), sacreBLEU's test gives it
    its least p, 1 / (1 + resamples), no resample differing from the observed 0.
  """
  named = [("baseline", list(baseline))] + [(f"system{i}", list(s)) for i, s in enumerate(systems)]
  test = significance.PairedTest(named, {"BLEU": BLEU()}, [list(references)], test_type="bs",
                                 n_samples=NUM_SAMPLES)
  signatures, scores = test()
  base, *others = scores["BLEU"]
  return [{
      "bleu": float(other.score), "baseline_bleu": float(base.score),
      "difference": float(other.score - base.score),
      "p_value": 1.0 if other.score == base.score else float(other.p_value),
      "signature": str(signatures["BLEU"])
  } for other in others]


def _records_score(json_path: str, scored: dict[str, Any]) -> bool:
  """Whether the evaluation JSON at `json_path` holds the step and BLEU of `scored`."""
  try:
    saved = json_files.read_json(json_path)
  except (OSError, ValueError):
    return False
  return (isinstance(saved, dict) and saved.get("step") == scored["step"] and
          isinstance(saved.get("bleu"), (int, float)) and not isinstance(saved["bleu"], bool) and
          math.isclose(saved["bleu"], scored["bleu"]))


def translations_file(run: dict[str, Any], workdir: str, split: str) -> str | None:
  """The path of `run`'s translations of `split` by the checkpoint its scores are of, in the
  eval/ folder of its `workdir`: the output name (`evaluation_files.output_name`), or where that
  holds another evaluation, the `<name>.<n>` the run's evaluation went to instead
  (`evaluation_files.output_stem`): the one whose JSON records the run's step and BLEU. The plain
  name where it has no JSON (published translations come back without theirs); else None."""
  decode, scored = run["config"]["decode"], run["scores"][split]
  name = evaluation_files.output_name(split, decode.get("checkpoint", "best"), scored["step"],
                                      decode["beam_size"], decode["alpha"])
  stem = os.path.join(workdir, workdir_files.EVAL_DIR, name)
  for candidate in evaluation_files.taken_stems(stem):
    if _records_score(candidate + ".json", scored):
      return candidate + ".txt"
  return None if os.path.exists(stem + ".json") else stem + ".txt"


def _references(run: dict[str, Any], split: str) -> list[str]:
  """The references of `split` of `run`'s task (its data, prepared when it trained)."""
  return pipeline.get_task(run_config.validate(run["config"]).task).target_texts(split)


def compare(run: dict[str, Any], partner: dict[str, Any], workdirs: Sequence[str],
            split: str) -> dict[str, Any] | None:
  """`paired_bootstrap` of `run` against `partner` on `split`, from their translations in the
  eval/ folders of `workdirs` (run's, partner's), with "against" and "against_row": the
  partner's run name and row; None
  where either's translations are missing or hold another number of sentences than the split,
  or the split's references cannot be read (with a warning)."""
  paths = [translations_file(r, w, split) for r, w in zip((run, partner), workdirs, strict=True)]
  if not all(path and os.path.exists(path) for path in paths):
    return None
  try:
    references = _references(run, split)
  except Exception as e:  # pylint: disable=broad-except  (the table is written without it)
    logging.warning("No paired bootstrap for %s on %s: its references cannot be read (%s).",
                    os.path.basename(run["workdir"]), split, e)
    return None
  system, baseline = (evaluate.read_sentences(path, "translation") for path in paths)
  if not len(system) == len(baseline) == len(references):
    return None  # translations of another version of the split
  return {
      "against": os.path.basename(partner["workdir"]), "against_row": partner["row"],
      **paired_bootstrap(references, baseline, [system])[0]
  }


def annotate(runs: list[dict[str, Any]], workdirs: Sequence[str]) -> None:
  """Adds "paired_bootstrap" (`compare` on each test split) to each run of `runs`
  (results.json's; `workdirs`: where each is) that has a partner: the run of its table's
  baseline row (`tables.BASELINE_ROWS`, else the table's first row) with the same task and
  seed. The baseline's own runs and runs without a partner or translations get none; a value
  from an earlier results.json is dropped first, so each comes from the files there now."""
  workdir_of = {id(run): workdir for run, workdir in zip(runs, workdirs, strict=True)}
  for run in runs:
    run.pop("paired_bootstrap", None)
  for table in dict.fromkeys(r["table"] for r in runs):
    table_runs = [r for r in runs if r["table"] == table]
    rows = verdicts.rows_in_order(table_runs, table)
    baseline_row = tables.BASELINE_ROWS.get(table)
    baseline_row = baseline_row if baseline_row in rows else rows[0]
    partners = {(r["task"], r["seed"]): r for r in table_runs if r["row"] == baseline_row}
    for run in table_runs:
      partner = partners.get((run["task"], run["seed"]))
      if partner is None or partner is run:
        continue
      for split in [s for s in run["scores"] if s != "validation" and s in partner["scores"]]:
        compared = compare(run, partner, (workdir_of[id(run)], workdir_of[id(partner)]), split)
        if compared is not None:
          run.setdefault("paired_bootstrap", {})[split] = compared
