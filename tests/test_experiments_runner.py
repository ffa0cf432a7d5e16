"""Tests for relpos.experiments.runner: a tiny two-row table, resume, outputs, and the same
table with its runs as child processes (--parallel; a signal to such a table is in
test_experiments_children.py)."""

import contextlib
import datetime
import functools
import io
import json
import os
import re
import shutil
import signal
import time

import flax
import jax
import pytest

import tiny_table
from relpos import metrics_writer
from relpos.experiments import report
from relpos.experiments import runner
from relpos.experiments import single_run
from relpos.experiments import status

# A child run killed outright (SIGKILL) after training, its last checkpoint saved, before its
# evaluation and result.
KILLED_BEFORE_RESULT = """
import os, runpy, signal, sys
from relpos.experiments import single_run
single_run.evaluate_run = lambda workdir: os.kill(os.getpid(), signal.SIGKILL)
sys.argv = ["run_one", *sys.argv[1:]]
runpy.run_module("relpos.experiments.run_one", run_name="__main__")
"""


@pytest.fixture(scope="module")
def finished_table(tmp_path_factory):
  root = tmp_path_factory.mktemp("table")
  output_dir = str(root / "out")
  outputs = runner.run_table("ablation", task="synthetic", seeds=[0], output_dir=output_dir,
                             rows=["abs",
                                   "rel_kv"], overrides=tiny_table.overrides(str(root / "tfds")))
  return root, output_dir, outputs


def test_two_rows_one_seed_write_results_table_and_plots(finished_table):
  _, output_dir, outputs = finished_table
  assert not outputs["preempted"]
  with open(os.path.join(output_dir, "results.json")) as f:
    results = json.load(f)
  runs = results["runs"]
  written = datetime.datetime.fromisoformat(results["written_at"])
  assert written.tzinfo == datetime.timezone.utc
  assert datetime.timedelta(0) <= datetime.datetime.now(datetime.timezone.utc) - written < (
      datetime.timedelta(hours=1))
  environment = {
      "jax_version": jax.__version__, "flax_version": flax.__version__,
      "device_kind": jax.devices()[0].device_kind, "device_count": jax.device_count()
  }
  assert results["schema_version"] == report.RESULTS_SCHEMA_VERSION == 5
  assert {k: results[k] for k in environment} == environment
  for run in runs:
    assert {k: run["environment"][k] for k in environment} == environment
    assert datetime.datetime.fromisoformat(run["environment"]["finished_at"]) <= written
  assert [(r["table"], r["row"], r["seed"]) for r in runs] == [("ablation", "abs", 0),
                                                               ("ablation", "rel_kv", 0)]
  for run in runs:
    assert set(run["scores"]) == {"validation", "test", "test_long"}
    assert run["scores"]["test"]["num_sentences"] == 8
    assert 0.0 <= run["scores"]["test"]["bleu"] <= 100.0
    assert run["scores"]["test"]["signature"].startswith("nrefs:1")
    assert run["num_params"] > 0 and run["steps_per_second"] > 0
    assert set(run["time_s"]) == {"training", "validation", "evaluation"}
    assert min(run["time_s"].values()) > 0
    assert sum(run["time_s"].values()) == pytest.approx(run["wall_time_s"])
    assert run["config"]["seed"] == 0 and run["config"]["train"]["num_steps"] == 4
    assert [s["step"] for s in run["starts"]] == [0]
    assert run["commits"] == [run["starts"][0]["commit"]] == [run["commit"]]
    assert run["commit"] == runner.source_tree.commit()
    latest = run["other_checkpoints"]["latest"]
    assert set(latest) == {"validation", "test", "test_long"}
    assert latest["test"]["step"] == 4 and latest["test"]["num_sentences"] == 8
    assert set(run["bleu_by_source_length"]) == {"test", "test_long"}
    for split in ("test", "test_long"):  # every sentence in one subset of what the split holds
      subsets = run["scores"][split]["bleu_by_subset"]
      assert sum(s["num_sentences"] for s in subsets.values()) == 8
    assert set(run["scores"]["test"]["bleu_by_subset"]) == {"in training", "not in training"}
    assert set(run["scores"]["test_long"]["bleu_by_subset"]) <= {
        "seen constructions", "2 relative clauses", "2 clauses"
    }
    _check_length_diagnostics(run)
    stats = run["position_statistics"]
    assert len(stats["attention_by_offset"]) == 1  # one encoder layer
    assert isinstance(stats["longest_distance"], int) and stats["longest_distance"] >= 2
    assert run["workdir"] == os.path.join("runs", f"synthetic-ablation-{run['row']}-seed0")
    validations = [
        r for r in metrics_writer.read_metrics(os.path.join(output_dir, run["workdir"]))
        if r["split"] == "validation"
    ]
    assert run["validation_curve"] == [[r["step"], r["bleu"]] for r in validations]
    assert [step for step, _ in run["validation_curve"]] == [4]
    _check_translations_written(os.path.join(output_dir, run["workdir"]), run)
  rel = runs[1]
  assert rel["config"]["model"]["position"] == "relative"
  assert len(rel["position_statistics"]["qak_by_offset"][0]) == 2 * 16 + 1
  assert "qak_by_offset" not in runs[0]["position_statistics"]
  # rel_kv against abs, seed 0, by paired bootstrap of their translations (the task's references)
  assert "paired_bootstrap" not in runs[0] and set(rel["paired_bootstrap"]) == {"test", "test_long"}
  for split, compared in rel["paired_bootstrap"].items():
    assert compared["against"] == "synthetic-ablation-abs-seed0"
    assert (compared["bleu"], compared["baseline_bleu"]) == pytest.approx(
        (rel["scores"][split]["bleu"], runs[0]["scores"][split]["bleu"]))
    assert 0 < compared["p_value"] <= 1
  table = open(os.path.join(output_dir, "table.md")).read()
  assert "## ablation: paired bootstrap against abs, seed by seed" in table
  assert "| abs | 1 |" in table and "| rel_kv | 1 |" in table
  assert "| test BLEU (latest) |" in table and "| test chrF |" in table
  assert "Checkpoint scored: best ('best' by validation BLEU); beside it latest" in table
  assert "BLEU by what test_long holds (sentences):" in table
  assert outputs["table"] == table
  names = sorted(os.path.basename(p) for p in outputs["plots"])
  assert names == [
      "attention_by_offset.png", "bleu_vs_length.png", "bleu_vs_step.png", "qak_by_offset.png"
  ]


def _check_translations_written(workdir: str, run: dict) -> None:
  """The final evaluation left each scored checkpoint's translations and scores of each split in
  workdir/eval, named and written as eval.py writes them."""
  choices = {"best": run["scores"], **run["other_checkpoints"]}
  decoding = run["config"]["decode"]
  written = sorted(os.listdir(os.path.join(workdir, "eval")))
  expected = []
  for choice, scores in choices.items():
    for split, scored in scores.items():
      stem = os.path.join(
          workdir, "eval",
          f"{split}.{choice}.step{scored['step']}.beam{decoding['beam_size']}.alpha{decoding['alpha']}"
      )
      expected += [os.path.basename(stem) + ".json", os.path.basename(stem) + ".txt"]
      with open(stem + ".json", encoding="utf-8") as f:
        saved = json.load(f)
      assert saved["bleu"] == scored["bleu"] and saved["split"] == split
      assert (saved["checkpoint"], saved["translations_file"]) == (choice, stem + ".txt")
      with open(stem + ".txt", encoding="utf-8") as f:
        assert len(f.read().splitlines()) == scored["num_sentences"]
  assert written == sorted(expected)


def _check_length_diagnostics(run: dict) -> None:
  """The schema-5 length diagnostics of a finished tiny run (8 sentences a split)."""
  for split in ("test", "test_long"):
    lengths = run["length_statistics"][split]
    assert lengths["num_sentences"] == 8 and lengths["ratio"] >= 0.0
    assert set(lengths["by_source_length"]) == set(run["bleu_by_source_length"][split])
    assert sum(b["num_sentences"] for b in lengths["by_source_length"].values()) == 8
    oracle = run["oracle_length"][split]
    assert oracle["num_sentences"] == 8 and 0.0 <= oracle["bleu"] <= 100.0
    assert set(oracle["bleu_by_source_length"]) == set(run["bleu_by_source_length"][split])
    assert oracle["length_ratio"] == pytest.approx(1.0, abs=0.1)  # re-encoded from text
    accuracy = run["token_accuracy_by_position"][split]
    assert len(accuracy["accuracy"]) == len(accuracy["count"]) == 2 * 48  # 2 x task.max_length
    assert accuracy["count"][0] == 8  # every target has a first token
    profile = run["attention_profile"][split]
    assert len(profile["normalized_entropy"]) == 1  # one encoder layer
    assert 0.0 <= profile["normalized_entropy"][0] <= 1.0 + 1e-6


def test_rerun_skips_finished_rows(finished_table, monkeypatch):
  root, output_dir, _ = finished_table
  before = os.path.getmtime(
      os.path.join(output_dir, "runs", "synthetic-ablation-abs-seed0", "result.json"))

  def fail(*args, **kwargs):
    raise AssertionError("a finished run was trained again")

  monkeypatch.setattr(single_run.train, "train_and_evaluate", fail)
  runner.run_table("ablation", task="synthetic", seeds=[0], output_dir=output_dir,
                   rows=["abs", "rel_kv"], overrides=tiny_table.overrides(str(root / "tfds")))
  assert os.path.getmtime(
      os.path.join(output_dir, "runs", "synthetic-ablation-abs-seed0", "result.json")) == before


def test_a_k_reads_as_its_number_and_a_row_given_twice_is_refused():
  """k=03 was trained beside k=3 as another row, the same run twice (the k plot showed them
  as two seeds of one k, std 0)."""
  assert runner.table_rows("k_sweep", ["k=03", "k=8"]) == ["k=3", "k=8"]
  with pytest.raises(ValueError,
                     match=re.escape("row 'k=3' is given more than once in --rows (k=3, k=03).")):
    runner.table_rows("k_sweep", ["k=3", "k=03"])
  with pytest.raises(ValueError, match=re.escape("row 'abs' is given more than once")):
    runner.table_rows("ablation", ["abs", "rel_kv", "abs"])


def test_unknown_row_and_override_fail_before_any_work(tmp_path):
  with pytest.raises(ValueError, match="row 'k=4' is not in table 'ablation'"):
    runner.run_table("ablation", task="synthetic", seeds=[0], output_dir=str(tmp_path),
                     rows=["k=4"])
  with pytest.raises(ValueError, match="no config field 'num_stepz'"):
    runner.run_table("ablation", task="synthetic", seeds=[0], output_dir=str(tmp_path),
                     rows=["abs"], overrides={"train.num_stepz": 3})
  with pytest.raises(
      ValueError,
      match=re.escape("--set model.max_relative_position=16 would change row k=0, which sets "
                      "model.max_relative_position=0")):
    runner.run_table("k_sweep", task="synthetic", seeds=[0], output_dir=str(tmp_path),
                     overrides={"model.max_relative_position": 16})
  assert not os.listdir(tmp_path)


def _results(output_dir: str) -> list[dict]:
  """The runs of results.json without what differs between two executions of the same run."""
  with open(os.path.join(output_dir, "results.json")) as f:
    runs = json.load(f)["runs"]
  varying = ("wall_time_s", "time_s", "steps_per_second", "machine_load", "commit", "commits",
             "starts", "workdir", "environment")
  return [{k: v for k, v in run.items() if k not in varying} for run in runs]


@pytest.fixture(scope="module")
def parallel_table(finished_table):
  """The finished table's two runs again with parallel=2, rel_kv's child killed after training.

  Returns:
    (output dir, run_table's outputs, what it printed).
  """
  root, _, _ = finished_table
  output_dir = str(root / "parallel")
  command = runner.child_command

  def killing_rel_kv(run, task, overrides):
    args = command(run, task, overrides)
    return [args[0], "-c", KILLED_BEFORE_RESULT, *args[3:]] if run.row == "rel_kv" else args

  with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(io.StringIO()) as out:
    patch.setattr(runner, "child_command", killing_rel_kv)
    outputs = runner.run_table("ablation", task="synthetic", seeds=[0], output_dir=output_dir,
                               rows=["abs", "rel_kv"], parallel=2,
                               overrides=tiny_table.overrides(str(root / "tfds")))
  return output_dir, outputs, out.getvalue()


def test_parallel_runs_equal_in_process_runs_and_a_killed_one_is_reported(
    finished_table, parallel_table):
  _, in_process_dir, _ = finished_table
  output_dir, outputs, printed = parallel_table
  rel_kv_log = os.path.join(output_dir, "runs", "synthetic-ablation-rel_kv-seed0", "run.log")
  assert outputs["failed"] == [f"synthetic-ablation-rel_kv-seed0: see {rel_kv_log}"]
  assert not outputs["preempted"]
  assert re.search(
      r"run [12] of 2 failed: synthetic-ablation-rel_kv-seed0 \(killed by SIGKILL\); "
      r"log: " + re.escape(rel_kv_log), printed)
  assert re.search(r"run [12] of 2 finished: synthetic-ablation-abs-seed0 \(test BLEU", printed)
  assert _results(output_dir) == _results(in_process_dir)[:1]  # abs: the same numbers
  failure = json.load(open(outputs["results"]))["failed"][0]
  assert (failure["run"], failure["error"], failure["log"]) == ("synthetic-ablation-rel_kv-seed0",
                                                                "killed by SIGKILL", rel_kv_log)
  abs_log = open(os.path.join(output_dir, "runs", "synthetic-ablation-abs-seed0", "run.log")).read()
  assert "relpos.experiments.run_one --table=ablation --row=abs --seed=0" in abs_log


def test_restart_skips_finished_runs_and_resumes_the_killed_one(finished_table, parallel_table):
  root, in_process_dir, _ = finished_table
  output_dir, _, _ = parallel_table
  abs_dir = os.path.join(output_dir, "runs", "synthetic-ablation-abs-seed0")
  abs_log = open(os.path.join(abs_dir, "run.log")).read()
  abs_written = os.path.getmtime(os.path.join(abs_dir, "result.json"))
  outputs = runner.run_table("ablation", task="synthetic", seeds=[0], output_dir=output_dir,
                             rows=["abs", "rel_kv"], parallel=2,
                             overrides=tiny_table.overrides(str(root / "tfds")))
  assert outputs["failed"] == [] and not outputs["preempted"]
  assert open(os.path.join(abs_dir, "run.log")).read() == abs_log  # not started again
  assert os.path.getmtime(os.path.join(abs_dir, "result.json")) == abs_written
  rel_kv_log = open(os.path.join(output_dir, "runs", "synthetic-ablation-rel_kv-seed0",
                                 "run.log")).read()
  assert "Resuming from step 4" in rel_kv_log
  assert _results(output_dir) == _results(in_process_dir)
  assert json.load(open(outputs["results"]))["failed"] == []  # trained again: not failed


def test_a_finished_run_line_gives_the_table_eta(capsys):
  result = {
      "config": {"task": {"name": "synthetic"}}, "workdir": "/x/ablation-abs-seed0",
      "scores": {"test": {"bleu": 97.25}}, "wall_time_s": 120.4
  }
  runner._print_finished(result, 2, 5, time.monotonic() - 600)  # 2 runs in 10 minutes
  line = capsys.readouterr().out.strip()
  assert line == ("relpos: run 2 of 5 finished: ablation-abs-seed0 (test BLEU 97.2, 120 s; "
                  "ETA 15 min for the 3 left)")
  runner._print_finished(result, 5, 5, time.monotonic() - 600)
  assert capsys.readouterr().out.strip().endswith("(test BLEU 97.2, 120 s)")


def _copy_table(finished_table, tmp_path) -> tuple[str, dict[str, object]]:
  """A copy of the finished table's output folder (to change without touching the fixture),
  and its overrides."""
  root, output_dir, _ = finished_table
  copy = str(tmp_path / "out")
  shutil.copytree(output_dir, copy)
  return copy, tiny_table.overrides(str(root / "tfds"))


def test_a_run_failing_in_process_is_named_and_the_others_go_on(finished_table, tmp_path,
                                                                monkeypatch, capsys, caplog):
  """As a child's failure does: with --parallel=1 the first failure ended the table, the runs
  after it never trained and no table was written."""
  output_dir, overrides = _copy_table(finished_table, tmp_path)
  for row in ("abs", "rel_kv"):  # both evaluated again
    os.remove(os.path.join(output_dir, "runs", f"synthetic-ablation-{row}-seed0", "result.json"))
  evaluate_run = single_run.evaluate_run

  def abs_fails(workdir):
    if "-abs-" in workdir:
      raise RuntimeError("a bug in evaluation")
    return evaluate_run(workdir)

  monkeypatch.setattr(single_run, "evaluate_run", abs_fails)
  outputs = runner.run_table("ablation", task="synthetic", seeds=[0], output_dir=output_dir,
                             rows=["abs", "rel_kv"], overrides=overrides)
  assert outputs["failed"] == ["synthetic-ablation-abs-seed0: a bug in evaluation"]
  assert "run 1 of 2 failed: synthetic-ablation-abs-seed0: a bug in evaluation" in (
      capsys.readouterr().out)
  assert "Traceback" in caplog.text or "a bug in evaluation" in caplog.text  # a bug: logged
  written = json.load(open(outputs["results"]))
  assert [r["row"] for r in written["runs"]] == ["rel_kv"]
  # The failure is on record where a reader looks, not only in this process's output.
  abs_run = runner.table_runs("ablation", "synthetic", ["abs"], [0], output_dir, "rows")[0]
  assert [(f["run"], f["error"], f["checkpoint"], f["log"]) for f in written["failed"]
         ] == [("synthetic-ablation-abs-seed0", "a bug in evaluation", 4, None)]
  assert re.search(
      r"Failed, so left out of the table: synthetic-ablation-abs-seed0 \(a bug in evaluation; "
      r"failed \S+ \S+ UTC, newest checkpoint step 4\)", outputs["table"])
  assert status.run_status(abs_run).state == "failed"
  assert "Failed, so left out of the table: synthetic-ablation-abs-seed0" in status.report(
      "ablation", "synthetic", [abs_run], output_dir)
  monkeypatch.setattr(single_run, "evaluate_run", evaluate_run)  # fixed: the same command
  outputs = runner.run_table("ablation", task="synthetic", seeds=[0], output_dir=output_dir,
                             rows=["abs", "rel_kv"], overrides=overrides)
  written = json.load(open(outputs["results"]))
  assert outputs["failed"] == [] and written["failed"] == []
  assert [r["row"] for r in written["runs"]] == ["abs", "rel_kv"]
  assert "Failed" not in outputs["table"]
  assert status.run_status(abs_run).state == "finished"


def test_a_finished_run_made_with_another_config_stops_the_table_before_any_work(
    finished_table, tmp_path, monkeypatch):
  output_dir, overrides = _copy_table(finished_table, tmp_path)
  monkeypatch.setattr(single_run.train, "train_and_evaluate", _must_not_train)
  result = os.path.join(output_dir, "runs", "synthetic-ablation-abs-seed0", "result.json")
  with pytest.raises(
      ValueError, match=re.escape(
          f"{result} was made with train.num_steps=4, not the 5 asked: pass --retrain_changed")):
    runner.run_table("ablation", task="synthetic", seeds=[0], output_dir=output_dir, rows=["abs"],
                     overrides={**overrides, "train.num_steps": 5})
  # Fields that change no result (where data is, how often to log and save) reuse the run.
  runner.run_table("ablation", task="synthetic", seeds=[0], output_dir=output_dir, rows=["abs"],
                   overrides={**overrides, "train.log_every_steps": 1, "train.keep_checkpoints": 3})


def test_an_unfinished_run_started_with_another_config_stops_the_table_before_any_work(
    finished_table, tmp_path, monkeypatch):
  """Resumed with another learning rate, it would be neither run, and its result.json would
  name only the second config."""
  output_dir, overrides = _copy_table(finished_table, tmp_path)
  workdir = os.path.join(output_dir, "runs", "synthetic-ablation-abs-seed0")
  os.remove(os.path.join(workdir, "result.json"))  # stopped before its final evaluation
  with open(os.path.join(workdir, "config.json")) as f:
    rate = json.load(f)["train"]["learning_rate"]
  monkeypatch.setattr(single_run.train, "train_and_evaluate", _must_not_train)
  with pytest.raises(
      ValueError, match=re.escape(
          f"{workdir}/config.json was started with train.learning_rate={rate!r}, not the 0.5 "
          "asked: pass --retrain_changed")):
    runner.run_table("ablation", task="synthetic", seeds=[0], output_dir=output_dir, rows=["abs"],
                     overrides={**overrides, "train.learning_rate": 0.5})
  assert runner.pending_runs(runner.table_runs("ablation", "synthetic", ["abs"], [0], output_dir),
                             task="synthetic", overrides={**overrides, "train.log_every_steps": 1},
                             retrain_changed=False)  # resumes it


def test_a_run_made_by_a_users_variant_edited_since_stops_the_table(finished_table, tmp_path,
                                                                    monkeypatch):
  """A table reused a finished run of a variant of one's own after its file was edited."""
  output_dir, overrides = _copy_table(finished_table, tmp_path)
  monkeypatch.setattr(single_run.train, "train_and_evaluate", _must_not_train)
  now = {"file": "/x/mine.py", "sha256": "b" * 64}
  monkeypatch.setattr(runner.user_modules, "variant_code", lambda position: now)
  path = os.path.join(output_dir, "runs", "synthetic-ablation-abs-seed0", "result.json")
  result = json.loads(open(path).read())
  for sha256, stops in (("a" * 64, True), ("b" * 64, False)):
    result["starts"][-1]["variant_code"] = {"file": "/x/mine.py", "sha256": sha256}
    with open(path, "w") as f:
      json.dump(result, f)
    table = functools.partial(runner.run_table, "ablation", task="synthetic", seeds=[0],
                              output_dir=output_dir, rows=["abs"], overrides=overrides)
    if stops:
      with pytest.raises(
          ValueError, match=re.escape(
              f"{path} was made with the code of position variant 'absolute' (/x/mine.py)="
              "'sha256:aaaaaaaaaaaa', not the 'sha256:bbbbbbbbbbbb' asked: pass --retrain_changed")
      ):
        table()
    else:
      table()  # the same file: reused
  # Unfinished, its starts.jsonl says which code trained its checkpoints.
  workdir = os.path.dirname(path)
  os.remove(path)
  with open(os.path.join(workdir, "starts.jsonl"), "a") as f:
    f.write(
        json.dumps({"step": 4, "variant_code": {"file": "/x/mine.py", "sha256": "c" * 64}}) + "\n")
  with pytest.raises(
      ValueError, match=re.escape(
          f"{workdir}/config.json was started with the code of position variant 'absolute' "
          "(/x/mine.py)='sha256:cccccccccccc', not the 'sha256:bbbbbbbbbbbb' asked")):
    table()


def test_a_run_asked_otherwise_than_the_folders_other_runs_stops_the_table(
    finished_table, tmp_path, monkeypatch):
  """table.md would compare a rel_k of 5 steps with the abs and rel_kv of 4 already there."""
  output_dir, overrides = _copy_table(finished_table, tmp_path)
  monkeypatch.setattr(single_run.train, "train_and_evaluate", _must_not_train)
  abs_result = os.path.join(output_dir, "runs", "synthetic-ablation-abs-seed0", "result.json")
  for retrain_changed in (False, True):
    with pytest.raises(
        ValueError, match=re.escape(
            f"{abs_result} was made with train.num_steps=4, not the 5 asked for this table's other "
            "runs: a table compares runs made alike; run with that setting, or pass another "
            "--output_dir.")):
      runner.run_table("ablation", task="synthetic", seeds=[0], output_dir=output_dir,
                       rows=["rel_k"], overrides={**overrides, "train.num_steps": 5},
                       retrain_changed=retrain_changed)
  with pytest.raises(ValueError, match=re.escape(f"{abs_result} was made with train.num_steps=4")):
    runner.run_table("ablation", task="synthetic", seeds=[0], output_dir=output_dir,
                     rows=["rel_kv"], overrides={**overrides, "train.num_steps": 5},
                     retrain_changed=True)  # nothing moved aside before it stops
  assert sorted(os.listdir(os.path.join(
      output_dir, "runs"))) == ["synthetic-ablation-abs-seed0", "synthetic-ablation-rel_kv-seed0"]
  # A seed of a row made with another value of a field the row sets (a one-row study may set
  # it) would be averaged with the row's other seeds.
  rel_kv_result = os.path.join(output_dir, "runs", "synthetic-ablation-rel_kv-seed0", "result.json")
  with pytest.raises(
      ValueError, match=re.escape(
          f"{rel_kv_result} was made with model.relative_value=True, not the False asked")):
    runner.run_table("ablation", task="synthetic", seeds=[1], output_dir=output_dir,
                     rows=["rel_kv"], overrides={**overrides, "model.relative_value": False})


def test_retrain_changed_keeps_the_old_run_aside_and_trains_it_again(finished_table, tmp_path):
  output_dir, overrides = _copy_table(finished_table, tmp_path)
  shutil.rmtree(os.path.join(output_dir, "runs", "synthetic-ablation-rel_kv-seed0"))  # abs alone
  outputs = runner.run_table("ablation", task="synthetic", seeds=[0], output_dir=output_dir,
                             rows=["abs"], overrides={**overrides, "train.num_steps": 5},
                             retrain_changed=True)
  runs_dir = os.path.join(output_dir, "runs")
  aside = [n for n in os.listdir(runs_dir) if n.startswith("synthetic-ablation-abs-seed0.")]
  assert len(aside) == 1 and re.fullmatch(r".*\.replaced-\d{8}T\d{6}Z", aside[0])
  with open(os.path.join(runs_dir, aside[0], "result.json")) as f:
    assert json.load(f)["config"]["train"]["num_steps"] == 4  # kept, not lost
  runs = {r["row"]: r for r in json.load(open(outputs["results"]))["runs"]}
  assert runs["abs"]["config"]["train"]["num_steps"] == 5
  assert runs["abs"]["validation_curve"][-1][0] == 5


def test_an_output_folder_holds_one_task_and_one_table_at_a_time(finished_table, tmp_path):
  output_dir, overrides = _copy_table(finished_table, tmp_path)
  with pytest.raises(ValueError, match=re.escape(f"{output_dir} holds runs of task 'synthetic' (")):
    runner.run_table("ablation", task="tiny", seeds=[0], output_dir=output_dir, rows=["abs"],
                     overrides=overrides)
  with runner.locks.hold(output_dir, lock_file=runner.TABLE_LOCK_FILE):
    with pytest.raises(
        runner.locks.WorkdirInUseError,
        match=re.escape(f"output folder {output_dir} is in use by process {os.getpid()} on host ")):
      runner.run_table("ablation", task="synthetic", seeds=[0], output_dir=output_dir, rows=["abs"],
                       overrides=overrides)


def _must_not_train(*args, **kwargs):
  raise AssertionError("a finished run was trained or evaluated again")


def test_a_run_finished_while_waiting_for_its_lock_is_not_evaluated_again(
    finished_table, tmp_path, monkeypatch):
  output_dir, overrides = _copy_table(finished_table, tmp_path)
  workdir = os.path.join(output_dir, "runs", "synthetic-ablation-abs-seed0")
  saved = open(os.path.join(workdir, "result.json")).read()
  monkeypatch.setattr(single_run.train, "train_and_evaluate", _must_not_train)
  monkeypatch.setattr(single_run, "evaluate_run", _must_not_train)
  result = single_run.run_one("ablation", "abs", 0, "synthetic", workdir, overrides)
  assert result == json.loads(saved)
  assert open(os.path.join(workdir, "result.json")).read() == saved


def test_sigterm_during_the_final_evaluation_stops_the_table_with_its_training_saved(
    finished_table, tmp_path, monkeypatch, capsys):
  output_dir, overrides = _copy_table(finished_table, tmp_path)
  workdir = os.path.join(output_dir, "runs", "synthetic-ablation-abs-seed0")
  os.remove(os.path.join(workdir, "result.json"))

  def stopped_midway(workdir):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)  # the handler raises first
    raise AssertionError("SIGTERM did not stop the evaluation")

  monkeypatch.setattr(single_run, "evaluate_run", stopped_midway)
  outputs = runner.run_table("ablation", task="synthetic", seeds=[0], output_dir=output_dir,
                             rows=["abs"], overrides=overrides)
  assert outputs["preempted"] and not os.path.exists(os.path.join(workdir, "result.json"))
  assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is restored


def test_time_is_summed_over_every_start_of_a_run(finished_table, tmp_path):
  """A finished 4-step run resumed to step 6: its result's times cover both starts, and both
  starts are recorded."""
  output_dir, overrides = _copy_table(finished_table, tmp_path)
  workdir = os.path.join(output_dir, "runs", "synthetic-ablation-abs-seed0")
  first_start_s = metrics_writer.elapsed_seconds(metrics_writer.read_metrics(workdir))
  os.remove(os.path.join(workdir, "result.json"))
  result = single_run.run_one("ablation", "abs", 0, "synthetic", workdir,
                              {**overrides, "train.num_steps": 6})
  assert [s["step"] for s in result["starts"]] == [0, 4]
  assert result["commits"] == [runner.source_tree.commit()]
  last_train = [r for r in metrics_writer.read_metrics(workdir) if r["split"] == "train"][-1]
  assert last_train["step"] == 6 and last_train["elapsed_s"] > first_start_s > 0
  validation_s = sum(
      r["time_s"] for r in metrics_writer.read_metrics(workdir) if r["split"] == "validation")
  assert result["time_s"]["validation"] == pytest.approx(validation_s)
  assert result["time_s"]["training"] + result["time_s"]["validation"] == pytest.approx(
      metrics_writer.elapsed_seconds(metrics_writer.read_metrics(workdir)))
  assert result["wall_time_s"] == pytest.approx(sum(result["time_s"].values()))


def test_status_of_a_real_table_reads_its_runs(finished_table, tmp_path):
  """relpos.experiments.status on the files a table really writes (the states themselves are
  tested in test_experiments_status.py): a finished run, and one whose result was removed."""
  output_dir, _ = _copy_table(finished_table, tmp_path)
  runs = runner.table_runs("ablation", "synthetic", ["abs", "rel_kv"], [0], output_dir)
  os.remove(runs[1].result)
  finished, stopped = (status.run_status(run) for run in runs)
  assert (finished.state, finished.step, finished.num_steps, finished.checkpoint) == ("finished", 4,
                                                                                      4, 4)
  with open(runs[0].result, encoding="utf-8") as f:
    scores = json.load(f)["scores"]
  assert finished.validation == (scores["validation"]["step"], scores["validation"]["bleu"])
  assert finished.test == ("test", scores["test"]["bleu"])
  validations = [(r["step"], r["bleu"])
                 for r in metrics_writer.read_metrics(runs[1].workdir)
                 if r["split"] == "validation"]
  assert stopped.validation == max(validations, key=lambda v: v[1])
  assert (stopped.state, stopped.step, stopped.checkpoint, stopped.test) == ("stopped", 4, 4, None)


def test_order_seeds_runs_every_row_of_a_seed_first(tmp_path):
  runs = runner.table_runs("ablation", "synthetic", ["abs", "rel_kv"], [0, 1], str(tmp_path),
                           order="seeds")
  assert [(r.row, r.seed) for r in runs] == [("abs", 0), ("rel_kv", 0), ("abs", 1), ("rel_kv", 1)]
  assert runs[0].workdir == os.path.join(str(tmp_path), "runs", "synthetic-ablation-abs-seed0")
  with pytest.raises(ValueError, match="order='random': allowed: rows, seeds"):
    runner.run_table("ablation", task="synthetic", seeds=[0], output_dir=str(tmp_path),
                     order="random")


def test_stack_seeds_trains_a_rows_seeds_as_one_program(finished_table, tmp_path, monkeypatch,
                                                        capsys):
  """A row's two seeds train together (neither alone), then each is scored as any run: seed 0
  as the table trained seed by seed has it."""
  root, output_dir, _ = finished_table

  def fail(*args, **kwargs):
    raise AssertionError("a seed was trained alone")

  monkeypatch.setattr(single_run.train, "train_and_evaluate", fail)
  stacked_dir = str(tmp_path / "out")
  with pytest.raises(
      ValueError, match="^stack_seeds trains a row's seeds in this process: not "
      "with parallel=2.$"):
    runner.run_table("ablation", task="synthetic", seeds=[0, 1], output_dir=stacked_dir,
                     rows=["abs"], parallel=2, stack_seeds=True)
  outputs = runner.run_table("ablation", task="synthetic", seeds=[0, 1], output_dir=stacked_dir,
                             rows=["abs"], overrides=tiny_table.overrides(str(root / "tfds")),
                             stack_seeds=True)
  assert not outputs["preempted"]
  assert ("relpos: training synthetic-ablation-abs-seed0, synthetic-ablation-abs-seed1 as one "
          "program") in capsys.readouterr().out
  with open(os.path.join(stacked_dir, "results.json")) as f:
    runs = json.load(f)["runs"]
  with open(os.path.join(output_dir, "results.json")) as f:
    alone = [r for r in json.load(f)["runs"] if r["row"] == "abs"][0]
  assert [(r["row"], r["seed"], [s["step"] for s in r["starts"]]) for r in runs
         ] == [("abs", 0, [0]), ("abs", 1, [0])]
  for split, scores in alone["scores"].items():
    # BLEU of a tiny run may be 0 either way; chrF is not (the check would hold for any two).
    assert scores["chrf"] > 0
    for metric in ("bleu", "chrf"):
      assert runs[0]["scores"][split][metric] == pytest.approx(scores[metric], abs=1e-3)
  validation_loss = lambda run, folder: [
      r["loss"]
      for r in metrics_writer.read_metrics(os.path.join(folder, run["workdir"]))
      if r["split"] == "validation"
  ]
  assert validation_loss(runs[0], stacked_dir) == pytest.approx(validation_loss(alone, output_dir),
                                                                rel=1e-4)


def test_a_published_table_outlives_its_output_folder(finished_table, tmp_path, monkeypatch):
  """--publish_to copies results.json, table.md, the plots and the runs' test translations; with
  --restore_from, the published runs whose folders are missing count as finished (marked
  restored, their translations back in eval/, nothing trained), a run whose folder exists is
  left as it is, and their configs are checked against the request like any finished run's."""
  root, _, _ = finished_table
  output_dir, overrides = _copy_table(finished_table, tmp_path)
  monkeypatch.setattr(single_run.train, "train_and_evaluate", _must_not_train)
  published_dir = str(tmp_path / "docs" / "results" / "ablation")
  outputs = runner.run_table("ablation", task="synthetic", seeds=[0], output_dir=output_dir,
                             rows=["abs", "rel_kv"], overrides=overrides, publish_to=published_dir)
  published = os.path.join(published_dir, "results.json")
  translations = {
      name: sorted(n
                   for n in os.listdir(os.path.join(output_dir, "runs", name, "eval"))
                   if n.endswith(".txt") and not n.startswith("validation.")
                  ) for name in ("synthetic-ablation-abs-seed0", "synthetic-ablation-rel_kv-seed0")
  }
  assert all(any(n.startswith("test.best.") for n in names) for names in translations.values())
  assert sorted(outputs["published"]) == sorted(
      [published, os.path.join(published_dir, "table.md")] +
      [os.path.join(published_dir, os.path.basename(p)) for p in outputs["plots"]] + [
          os.path.join(published_dir, "translations", name, n)
          for name, names in translations.items()
          for n in names
      ])
  for path in outputs["published"]:  # each a copy of its source, byte for byte
    parts = os.path.relpath(path, published_dir).split(os.sep)
    source = (os.path.join(output_dir, "runs", parts[1], "eval", parts[2])
              if parts[0] == "translations" else os.path.join(output_dir, parts[0]))
    assert open(path, "rb").read() == open(source, "rb").read(), path
  with open(published, encoding="utf-8") as f:
    published_runs = {r["row"]: r for r in json.load(f)["runs"]}

  not_a_folder = tmp_path / "a_file"
  not_a_folder.write_text("")
  with pytest.raises(ValueError, match=re.escape(f"--publish_to {not_a_folder}: cannot write")):
    runner.run_table("ablation", task="synthetic", seeds=[0], output_dir=output_dir, rows=["abs"],
                     overrides=overrides, publish_to=str(not_a_folder))

  lost = str(tmp_path / "lost")
  # Publishing from a folder without the published runs would drop them: refused at the start.
  with pytest.raises(
      ValueError, match=re.escape(
          f"--publish_to {published_dir} holds 2 finished runs that {lost} lacks "
          "(synthetic-ablation-abs-seed0, synthetic-ablation-rel_kv-seed0): publishing would drop "
          f"them. Add --restore_from={published} to bring them back, or publish elsewhere.")):
    runner.run_table("ablation", task="synthetic", seeds=[0], output_dir=lost, rows=["abs"],
                     overrides=overrides, publish_to=published_dir)
  assert not os.path.exists(os.path.join(lost, "runs"))
  with pytest.raises(ValueError, match=re.escape("was made with train.num_steps=4, not the 5")):
    runner.run_table("ablation", task="synthetic", seeds=[0], output_dir=lost, rows=["abs"],
                     overrides={**overrides, "train.num_steps": 5}, restore_from=published)
  with pytest.raises(
      ValueError, match=re.escape(f"--restore_from {published} holds runs of "
                                  "table ablation on synthetic, not of table "
                                  "k_sweep on synthetic.")):
    runner.run_table("k_sweep", task="synthetic", seeds=[0], output_dir=lost, rows=["k=2"],
                     overrides=overrides, restore_from=published)
  shutil.rmtree(lost)
  os.makedirs(os.path.join(lost, "runs", "synthetic-ablation-rel_kv-seed0"))  # a run begun anew
  runs = runner.table_runs("ablation", "synthetic", ["abs", "rel_kv"], [0], lost)
  assert runner.results.restore_published(published, lost, table="ablation",
                                          task="synthetic") == [runs[0].workdir]
  assert os.listdir(runs[1].workdir) == []
  shutil.rmtree(runs[1].workdir)

  restored = runner.run_table("ablation", task="synthetic", seeds=[0], output_dir=lost,
                              rows=["abs", "rel_kv"], overrides=overrides, restore_from=published,
                              publish_to=str(tmp_path / "again"))
  with open(restored["results"], encoding="utf-8") as f:
    runs_after = {r["row"]: r for r in json.load(f)["runs"]}
  first_restore = {row: run.pop("restored") for row, run in runs_after.items()}
  for row, run in runs_after.items():
    assert first_restore[row]["from"] == published and "earlier" not in first_restore[row]
    assert run == published_runs[row]  # the published result, whole
  for run in runs:
    eval_dir = os.path.join(run.workdir, "eval")
    assert sorted(os.listdir(eval_dir)) == translations[run.name]
    again = tmp_path / "again" / "translations" / run.name
    assert sorted(os.listdir(again)) == translations[run.name]  # published again from there
  restored_line = re.search(r"Restored from .*\n\n", restored["table"]).group()
  assert restored_line.startswith(f"Restored from `{published}` on "
                                  f"{datetime.date.today().isoformat()} (`--restore_from`")
  assert restored_line.endswith("): abs seed 0, rel_kv seed 0.\n\n")
  # The published table, with that one sentence added.
  assert restored["table"].replace(restored_line,
                                   "") == report.render_table(list(published_runs.values()))
  row = status.report("ablation", "synthetic", runs, lost).splitlines()[4]
  assert row.startswith("synthetic-ablation-abs-seed0     finished (restored)  -")

  # Lost a second time: restored from the copy published after the first loss, with the first
  # restore kept on record.
  republished, lost_again = str(tmp_path / "again" / "results.json"), str(tmp_path / "lost2")
  runs = runner.table_runs("ablation", "synthetic", ["abs", "rel_kv"], [0], lost_again)
  # Every published run of the table comes back, not only those of the rows asked for now.
  assert runner.results.restore_published(republished, lost_again, table="ablation",
                                          task="synthetic") == [run.workdir for run in runs]
  with open(os.path.join(runs[0].workdir, "result.json"), encoding="utf-8") as f:
    second_restore = json.load(f)["restored"]
  assert second_restore["from"] == republished
  assert second_restore["earlier"] == [first_restore["abs"]]


def test_a_run_lost_in_flight_is_trained_again_and_the_table_says_so(finished_table, tmp_path,
                                                                     capsys):
  """The runs in flight published beside the results (as --status and a stopped table write
  them): after the output folder is lost, --restore_from brings back the finished runs, records
  the one that was training as lost (trained again from step 0, its published step on record)
  and table.md names it; published again, the loss comes back with the run."""
  output_dir, overrides = _copy_table(finished_table, tmp_path)
  runs = runner.table_runs("ablation", "synthetic", ["abs", "rel_kv"], [0], output_dir)
  os.remove(runs[1].result)  # rel_kv trained its 4 steps, not yet evaluated: in flight
  published_dir = str(tmp_path / "published")
  runner.results.write_outputs(output_dir, published_dir)
  status.publish_in_flight(published_dir, runs, output_dir)
  lost = str(tmp_path / "lost")
  # A look from the machine that lost the folder, before the restart, keeps the run in flight.
  status.publish_in_flight(published_dir,
                           runner.table_runs("ablation", "synthetic", ["abs", "rel_kv"], [0], lost),
                           lost)
  capsys.readouterr()

  again = str(tmp_path / "again")
  outputs = runner.run_table("ablation", task="synthetic", seeds=[0], output_dir=lost,
                             rows=["abs", "rel_kv"], overrides=overrides,
                             restore_from=os.path.join(published_dir,
                                                       "results.json"), publish_to=again)
  printed = capsys.readouterr().out
  assert ("relpos: synthetic-ablation-rel_kv-seed0: its folder is missing; it had reached "
          "step 4 of 4 (checkpoint 4) as of ") in printed
  with open(outputs["results"], encoding="utf-8") as f:
    by_row = {run["row"]: run for run in json.load(f)["runs"]}
  assert "lost" not in by_row["abs"] and "restored" in by_row["abs"]
  [loss] = by_row["rel_kv"]["lost"]
  assert (loss["step"], loss["checkpoint"], loss["num_steps"]) == (4, 4, 4)
  assert "restored" not in by_row["rel_kv"]  # trained again here, from step 0
  with open(os.path.join(lost, "runs", "synthetic-ablation-rel_kv-seed0", "metrics.jsonl"),
            encoding="utf-8") as f:
    assert json.loads(f.readline())["step"] == 2  # its first record: trained from step 0
  line = re.search(r"Trained again from step 0 .*\n", outputs["table"]).group()
  assert line.endswith(f"each having reached: rel_kv seed 0 (step 4 of 4 (checkpoint 4) as of "
                       f"{loss['as_of'][:16].replace('T', ' ')} UTC).\n")
  assert status.report("ablation", "synthetic", runs, lost).endswith(
      "Trained again from step 0 after their folder was lost, each having reached: "
      f"synthetic-ablation-rel_kv-seed0 (step 4 of 4 (checkpoint 4) as of "
      f"{loss['as_of'][:16].replace('T', ' ')} UTC).")

  # Lost again, finished: restored from the copy published since, with its loss on record.
  lost_again = str(tmp_path / "lost2")
  runner.results.restore_published(os.path.join(again, "results.json"), lost_again,
                                   table="ablation", task="synthetic")
  with open(os.path.join(lost_again, "runs", "synthetic-ablation-rel_kv-seed0", "result.json"),
            encoding="utf-8") as f:
    assert json.load(f)["lost"] == [loss]
  runs_again = runner.table_runs("ablation", "synthetic", ["abs", "rel_kv"], [0], lost_again)
  assert status.report("ablation", "synthetic", runs_again, lost_again).endswith(
      "synthetic-ablation-rel_kv-seed0 (step 4 of 4 (checkpoint 4) as of "
      f"{loss['as_of'][:16].replace('T', ' ')} UTC).")
