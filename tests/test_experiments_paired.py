"""Tests for relpos.experiments.paired: sacreBLEU's paired bootstrap of two runs' translations,
the runs of a table it pairs, and its section of table.md."""

import json
import os
import pathlib
import random
import re
import subprocess
import sys

import pytest
from sacrebleu.metrics import BLEU

from relpos import evaluation_files
from relpos.experiments import paired
from relpos.experiments import report

WORDS = "a man in a red shirt rides a bike down the street while two dogs run behind him".split()


def _sentences(seed: int, n: int = 60) -> list[str]:
  rng = random.Random(seed)
  return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))) for _ in range(n)]


def _noisy(references: list[str], seed: int, rate: float) -> list[str]:
  """References with a share `rate` of their words replaced at random."""
  rng = random.Random(seed)
  return [
      " ".join(rng.choice(WORDS) if rng.random() < rate else w
               for w in s.split())
      for s in references
  ]


def test_paired_bootstrap_equals_sacrebleus_command(tmp_path):
  references = _sentences(0)
  baseline, better = _noisy(references, 1, 0.5), _noisy(references, 2, 0.3)
  for name, lines in (("ref", references), ("base", baseline), ("better", better)):
    (tmp_path / name).write_text("".join(line + "\n" for line in lines))
  compared, = paired.paired_bootstrap(references, baseline, [better])
  assert compared["bleu"] == pytest.approx(BLEU().corpus_score(better, [references]).score)
  assert compared["baseline_bleu"] == pytest.approx(BLEU().corpus_score(baseline,
                                                                        [references]).score)
  assert compared["difference"] == pytest.approx(compared["bleu"] - compared["baseline_bleu"])
  assert compared["difference"] > 5 and compared["p_value"] < 0.01
  assert "bs:1000|seed:12345" in compared["signature"]
  done = subprocess.run([
      sys.executable, "-m", "sacrebleu",
      str(tmp_path / "ref"), "-i",
      str(tmp_path / "base"),
      str(tmp_path / "better"), "-m", "bleu", "--paired-bs"
  ], capture_output=True, text=True, check=True)
  base, system = json.loads(done.stdout)
  assert (base["BLEU"]["score"], system["BLEU"]["score"],
          system["BLEU"]["p_value"]) == pytest.approx(
              (compared["baseline_bleu"], compared["bleu"], compared["p_value"]))
  close, = paired.paired_bootstrap(references, baseline, [_noisy(references, 3, 0.45)])
  assert 0.05 < close["p_value"] < 1  # a small gain on 60 sentences: within the noise


def test_translations_equal_to_the_baselines_differ_with_p_1():
  """sacreBLEU gives them its least p, 1 / 1001, as if the difference of 0 were significant."""
  references = _sentences(0)
  baseline = _noisy(references, 1, 0.5)
  same, other = paired.paired_bootstrap(
      references, baseline, [list(baseline), _noisy(references, 3, 0.45)])
  assert (same["difference"], same["p_value"]) == (0.0, 1.0)
  assert other["p_value"] < 1.0


def test_two_systems_scoring_0_differ_with_p_1():
  """Other translations, each BLEU 0 on every resample (a barely trained run): sacreBLEU
  found their difference of 0 significant, p = 1 / 1001."""
  references = ["the cat sat on the mat ."] * 20
  zero, = paired.paired_bootstrap(references, ["x y z"] * 20, [["p q"] * 20])
  assert (zero["bleu"], zero["baseline_bleu"], zero["p_value"]) == (0.0, 0.0, 1.0)


def _run(tmp_path, row: str, seed: int, translations: list[str] | None, table="ablation") -> dict:
  """A finished run's result, with its translations of `test` in its eval/ folder."""
  workdir = f"runs/{row}-seed{seed}"
  run = {
      "table": table, "row": row, "seed": seed, "task": "synthetic", "workdir": workdir,
      "config": {"decode": {"checkpoint": "best", "beam_size": 4, "alpha": 0.6}},
      "scores": {"validation": {"bleu": 1.0, "step": 10}, "test": {"bleu": 1.0, "step": 10}},
      "paired_bootstrap": {"test": "from an earlier results.json"}
  }
  if translations is not None:
    path = paired.translations_file(run, str(tmp_path / workdir), "test")
    name = evaluation_files.output_name("test", "best", 10, 4, 0.6)
    assert os.path.basename(path) == name + ".txt"
    os.makedirs(os.path.dirname(path))
    with open(path, "w", encoding="utf-8") as f:
      f.write("".join(t + "\n" for t in translations))
  return run


def test_annotate_pairs_each_run_with_its_seeds_baseline(tmp_path, monkeypatch):
  references = _sentences(0)
  monkeypatch.setattr(paired, "_references", lambda run, split: references)
  abs0, abs1 = _noisy(references, 1, 0.5), _noisy(references, 3, 0.5)
  rel0 = _noisy(references, 2, 0.3)
  runs = [
      _run(tmp_path, "rel_kv", 0, rel0),
      _run(tmp_path, "abs", 0, abs0),
      _run(tmp_path, "rel_kv", 1, _noisy(references, 4, 0.3)),
      _run(tmp_path, "abs", 1, None),  # restored without its translations
      _run(tmp_path, "none", 1, _noisy(references, 5, 0.5)),
      _run(tmp_path, "k=2", 0, abs1, table="k_sweep"),  # no k=16: the first row is the baseline
      _run(tmp_path, "k=4", 0, rel0, table="k_sweep"),
  ]
  paired.annotate(runs, [str(tmp_path / r["workdir"]) for r in runs])
  with_pairs = {(r["table"], r["row"], r["seed"]): r["paired_bootstrap"]["test"]
                for r in runs
                if "paired_bootstrap" in r}
  assert set(with_pairs) == {("ablation", "rel_kv", 0), ("k_sweep", "k=4", 0)}
  rel_kv = with_pairs["ablation", "rel_kv", 0]
  assert rel_kv == {
      "against": "abs-seed0", "against_row": "abs",
      **paired.paired_bootstrap(references, abs0, [rel0])[0]
  }
  assert with_pairs["k_sweep", "k=4", 0]["against_row"] == "k=2"
  assert "paired_bootstrap" not in runs[1]  # the baseline, and the value read before, dropped

  text = report.render_table([{**r, **_table_fields()} for r in runs[:5]])
  section = text.split("## ablation: paired bootstrap against abs, seed by seed\n\n")[1]
  assert rel_kv["p_value"] == 1 / 1001
  assert section.split("\n\n")[1:3] == [
      "test:",
      "| row | seed 0 | seed 1 |\n| --- | --- | --- |\n"
      f"| rel_kv | {rel_kv['difference']:+.1f} (p ≤ 0.001) | – |\n"  # 1 / (1 + 1000): no resample
      "| none | – | – |"
  ]
  assert re.search(r"paired bootstrap over the test sentences \(`nrefs:1\|bs:1000\|seed:12345",
                   section)


def test_references_that_cannot_be_read_leave_the_runs_without_a_pair(tmp_path, monkeypatch):
  references = _sentences(0)

  def gone(run, split):
    raise FileNotFoundError(f"no data for {split}")

  monkeypatch.setattr(paired, "_references", gone)
  runs = [
      _run(tmp_path, "rel_kv", 0, _noisy(references, 2, 0.3)),
      _run(tmp_path, "abs", 0, _noisy(references, 1, 0.5))
  ]
  paired.annotate(runs, [str(tmp_path / r["workdir"]) for r in runs])
  assert not any("paired_bootstrap" in r for r in runs)
  monkeypatch.setattr(paired, "_references", lambda run, split: references[:-1])
  paired.annotate(runs, [str(tmp_path / r["workdir"]) for r in runs])  # another split's length
  assert not any("paired_bootstrap" in r for r in runs)


def _table_fields() -> dict:
  """What render_table reads of a run besides the pairing (a finished run's minimum)."""
  return {"commit": "abc1234", "wall_time_s": 10.0, "steps_per_second": 1.0, "k": None}


def test_the_translations_are_those_of_the_evaluation_the_run_recorded(tmp_path):
  """Where the output name held another evaluation (a folder moved, then evaluated again), the
  run's went to `<name>.2`: its JSON says which; with JSONs there and none of the run's score,
  none is taken; without any (published translations come back alone), the plain name."""
  run = _run(tmp_path, "abs", 0, None)
  eval_dir = tmp_path / "w" / "eval"
  eval_dir.mkdir(parents=True)
  stem = str(eval_dir / evaluation_files.output_name("test", "best", 10, 4, 0.6))
  assert paired.translations_file(run, str(tmp_path / "w"), "test") == stem + ".txt"
  pathlib.Path(stem + ".json").write_text(json.dumps({"step": 10, "bleu": 7.5}))
  assert paired.translations_file(run, str(tmp_path / "w"), "test") is None
  pathlib.Path(stem + ".2.json").write_text(json.dumps({"step": 10, "bleu": 1.0}))
  assert paired.translations_file(run, str(tmp_path / "w"), "test") == stem + ".2.txt"
  pathlib.Path(stem + ".json").write_text(json.dumps({"step": 10, "bleu": 1.0}))
  assert paired.translations_file(run, str(tmp_path / "w"), "test") == stem + ".txt"
