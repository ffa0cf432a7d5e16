"""Tests for relpos.experiments.synthetic_subsets: a synthetic run's test translations scored on
the test pairs seen in training or not, and on the test_long sentences by construction."""
import json
import os
import re
import subprocess
import sys

import pytest

from configs import default
from configs import tiny
from relpos import run_config
from relpos import scoring
from relpos.data import synthetic
from relpos.experiments import synthetic_subsets

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _evaluated_run(tmp_path, translate, step: int = 12) -> str:
  """A workdir of the tiny synthetic config whose eval/ holds `translate(split, targets)` of test
  and test_long at `step`, each with the JSON eval.py writes beside it."""
  workdir = str(tmp_path / "run")
  os.makedirs(os.path.join(workdir, "eval"), exist_ok=True)
  config = run_config.validate(tiny.get_config())
  run_config.write_to(config, workdir)
  splits = synthetic.SyntheticParams.of(config.task).splits()
  for split in synthetic_subsets.SPLITS:
    targets = [t for _, t in splits[split]]
    hypotheses = translate(split, targets)
    stem = os.path.join(workdir, "eval", f"{split}.best.step{step}.beam2.alpha0.6")
    with open(stem + ".txt", "w", encoding="utf-8") as f:
      f.write("\n".join(hypotheses) + "\n")
    recorded = scoring.score(hypotheses, targets, language="de")
    with open(stem + ".json", "w", encoding="utf-8") as f:
      json.dump(
          {
              "split": split, "checkpoint": "best", "step": step, "beam_size": 2, "alpha": 0.6,
              "num_sentences": len(targets), "translations_file": "elsewhere.txt", **recorded
          }, f)
  return workdir


def test_a_run_is_scored_on_each_subset(tmp_path):
  config = run_config.validate(tiny.get_config())
  splits = synthetic.SyntheticParams.of(config.task).splits()
  two_clauses = [synthetic.clause_count(s) == 2 for s, _ in splits["test_long"]]
  assert 0 < sum(two_clauses) < len(two_clauses)

  def translate(split, targets):  # the two-clause sentences lose their second clause
    if split == "test":
      return targets
    return [t.split(" ke ")[0] for t in targets]

  scored = synthetic_subsets.run_subsets(_evaluated_run(tmp_path, translate))
  test = {s.name: s for s in scored["test"]}
  assert test["all"].bleu == pytest.approx(100.0) and test["all"].num_sentences == 16
  assert test["in training"].num_sentences + test["not in training"].num_sentences == 16
  long = {s.name: s for s in scored["test_long"]}
  assert [s.name for s in scored["test_long"]] == [  # tiny's 8 sentences hold one of each kind
      "all", "seen constructions", "2 relative clauses", "2 clauses"
  ]
  assert long["seen constructions"].bleu == pytest.approx(100.0)
  assert long["2 relative clauses"].bleu == pytest.approx(100.0)
  assert long["2 clauses"].num_sentences == sum(two_clauses) and long["2 clauses"].bleu < 60.0
  lines = synthetic_subsets.markdown_lines({"run": scored})
  assert "| run | all | seen constructions | 2 relative clauses | 2 clauses |" in lines
  assert (f"| run | {long['all'].bleu:.1f} (8) | 100.0 ({long['seen constructions'].num_sentences})"
          f" | 100.0 (1) |") in " ".join(lines)


def test_translations_out_of_line_with_the_split_are_refused(tmp_path):
  workdir = _evaluated_run(tmp_path, lambda split, targets: targets)
  path = os.path.join(workdir, "eval", "test.best.step12.beam2.alpha0.6.txt")
  with open(path, encoding="utf-8") as f:
    lines = f.read().split("\n")
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(lines[1:] + lines[:1]))  # shifted by one sentence
  with pytest.raises(
      ValueError, match=r"the test translations in .* do not line up with the "
      r"test split generated from .*config\.json \(BLEU"):
    synthetic_subsets.run_subsets(workdir)


def test_a_run_without_its_evaluation_or_of_another_task_is_one_line(tmp_path):
  workdir = _evaluated_run(tmp_path, lambda split, targets: targets)
  os.remove(os.path.join(workdir, "eval", "test_long.best.step12.beam2.alpha0.6.json"))
  done = subprocess.run(
      [sys.executable, "-m", "relpos.experiments.synthetic_subsets", f"--workdirs={workdir}"],
      cwd=ROOT, capture_output=True, text=True)
  assert done.returncode == 1 and done.stderr.strip().splitlines()[-1] == (
      f"error: {workdir}/eval holds no evaluation of test_long at checkpoint best with beam 2, "
      f"alpha 0.6: run python eval.py --workdir={workdir} --split=test_long --checkpoint=best.")
  config = default.get_config()  # tiny's task.synthetic sizes are refused under multi30k
  config.task.name = "multi30k"
  run_config.write_to(run_config.validate(config), workdir)
  with pytest.raises(ValueError, match=re.escape(f"{workdir} is a run of task 'multi30k'")):
    synthetic_subsets.run_subsets(workdir)


def test_of_several_evaluations_of_a_checkpoint_the_newest_is_scored(tmp_path, caplog):
  """eval.py --checkpoint=best at step 12 (name sorts first), then the final evaluation of the
  best checkpoint, step 8: the final one's translations are scored, the older named."""
  _evaluated_run(tmp_path, lambda split, targets: ["x"] * len(targets), step=12)
  workdir = _evaluated_run(tmp_path, lambda split, targets: targets, step=8)
  older = os.path.join(workdir, "eval", "test.best.step12.beam2.alpha0.6.json")
  os.utime(older, (1, 1))
  os.utime(older.replace("test.", "test_long.", 1), (1, 1))
  scored = synthetic_subsets.run_subsets(workdir)
  assert scored["test"][0].bleu == pytest.approx(100.0)
  assert f"older: {older} (step 12)" in caplog.text
