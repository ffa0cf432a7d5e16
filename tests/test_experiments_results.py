"""Tests for relpos.experiments.results: reading a run's result.json, collecting a table's,
and the workdir a result records (relative to the table's folder, or absolute in older ones);
writing back published results (--restore_from)."""
import json
import os
import re

import pytest

from relpos import metrics_writer
from relpos.experiments import results


def test_a_result_records_its_workdir_relative_to_the_table_and_older_absolute_ones_read(tmp_path):
  workdir = str(tmp_path / "out" / results.RUNS_DIR / "synthetic-ablation-abs-seed0")
  relative = results.relative_workdir(workdir)
  assert relative == os.path.join("runs", "synthetic-ablation-abs-seed0")
  output_dir = str(tmp_path / "moved")
  assert results.workdir_of({"workdir": relative},
                            output_dir) == os.path.join(output_dir, "runs",
                                                        "synthetic-ablation-abs-seed0")
  assert results.workdir_of({"workdir": workdir}, output_dir) == workdir  # an older result


@pytest.mark.parametrize(
    "content,reason",
    [("[]", "no 'table'"), ("{}", "no 'table'"),
     ('{"table": "ablation", "row": "abs", "seed": 0, "task": "synthetic", "config": {}, '
      '"workdir": "w"}', "no 'scores'")])
def test_a_result_of_the_wrong_shape_is_left_out_of_the_table_naming_it(
    tmp_path, content, reason, caplog):
  path = tmp_path / "runs" / "synthetic-ablation-abs-seed0" / "result.json"
  path.parent.mkdir(parents=True)
  path.write_text(content)
  assert results.collect(str(tmp_path)) == []
  assert f"{path} is not a run's result ({reason}): delete it" in caplog.text
  with pytest.raises(ValueError, match=re.escape(f"{path} is not a run's result ({reason})")):
    results.read_result(str(path))


def test_the_environment_names_the_host_cpu():
  assert results.environment()["host_cpu"] == metrics_writer.host_cpu()


@pytest.mark.parametrize("content, message", [
    (None, "--restore_from {path}: No such file or directory."),
    ("{", "--restore_from {path} is not a table's results.json (Expecting property name"),
    ('{"runs": 3}', "--restore_from {path} is not a table's results.json (no 'runs' list)."),
    ('{"runs": [{"row": "abs"}]}', "--restore_from {path} holds a run without table, row"),
    ('{"runs": [{"table": "k_sweep", "row": "k=2", "seed": 0, "task": "synthetic", "scores": {},'
     ' "config": {}, "workdir": "runs/synthetic-k_sweep-k2-seed0"}]}',
     "--restore_from {path} holds runs of table k_sweep on synthetic, not of table ablation on "
     "synthetic."),
])
def test_restore_from_a_file_that_is_not_a_results_json_is_refused_in_one_line(
    tmp_path, content, message):
  path = tmp_path / "results.json"
  if content is not None:
    path.write_text(content)
  with pytest.raises(ValueError, match=re.escape(message.format(path=path))):
    results.restore_published(str(path), str(tmp_path / "out"), table="ablation", task="synthetic")


def test_restore_brings_back_every_table_of_the_folder_so_publishing_keeps_them(tmp_path):
  """A folder (and so its published results.json) may hold several tables of one task: after a
  loss, restoring one table brings back them all, and publishing there then drops none."""
  run = lambda table, row: {
      "table": table, "row": row, "seed": 0, "task": "synthetic", "scores": {}, "config": {},
      "workdir": f"runs/synthetic-{table}-{row.replace('=', '')}-seed0"
  }
  published_dir = tmp_path / "published"
  published_dir.mkdir()
  published = published_dir / "results.json"
  published.write_text(json.dumps({"runs": [run("ablation", "abs"), run("k_sweep", "k=2")]}))
  lost = str(tmp_path / "lost")
  with pytest.raises(ValueError, match="holds 2 finished runs that"):
    results.check_publish_keeps(str(published_dir), lost, table="ablation", task="synthetic")
  restored = results.restore_published(str(published), lost, table="ablation", task="synthetic")
  assert [os.path.basename(w) for w in restored
         ] == ["synthetic-ablation-abs-seed0", "synthetic-k_sweep-k2-seed0"]
  results.check_publish_keeps(str(published_dir), lost, table="ablation", task="synthetic")


def test_a_restore_killed_midway_leaves_no_run_folder_and_is_done_again(tmp_path, monkeypatch):
  """A run folder without its result.json reads as a run begun, which the table trains again
  from step 0: a restore killed before its result.json was written leaves none."""
  published = _published_abs_run(tmp_path / "published", "synthetic-ablation-abs-seed0",
                                 "runs/synthetic-ablation-abs-seed0")
  lost = tmp_path / "lost"
  killed = lambda *args, **kwargs: (_ for _ in ()).throw(KeyboardInterrupt())
  monkeypatch.setattr(results.json_files, "write_json", killed)
  with pytest.raises(KeyboardInterrupt):
    results.restore_published(str(published), str(lost), table="ablation", task="synthetic")
  assert not (lost / results.RUNS_DIR / "synthetic-ablation-abs-seed0").exists()
  monkeypatch.undo()
  [workdir] = results.restore_published(str(published), str(lost), table="ablation",
                                        task="synthetic")
  assert sorted(os.listdir(lost / results.RUNS_DIR)) == ["synthetic-ablation-abs-seed0"]
  assert os.path.exists(os.path.join(workdir, results.RESULT_FILE))
  assert os.listdir(os.path.join(workdir, "eval")) == ["t.txt"]


def test_a_restore_records_where_it_came_from_within_its_repository(tmp_path):
  """docs/results/<table>/results.json of a clone, wherever the clone lies; a file outside any
  git work tree as given."""
  published = tmp_path / "clone" / "docs" / "results" / "t" / "results.json"
  published.parent.mkdir(parents=True)
  assert results.repository_path(str(published)) == str(published)
  (tmp_path / "clone" / ".git").mkdir()
  assert results.repository_path(str(published)) == "docs/results/t/results.json"


def test_a_run_published_under_an_older_folder_name_is_restored_where_the_table_looks(tmp_path):
  """Runs published before the task led the folder name (`ablation-abs-seed0`) come back under
  the name the table finds them by, with their translations, and are not trained again."""
  published_dir = tmp_path / "published"
  published = _published_abs_run(published_dir, "ablation-abs-seed0",
                                 "/old/machine/runs/ablation-abs-seed0")
  out = str(tmp_path / "out")
  [workdir] = results.restore_published(str(published), out, table="ablation", task="synthetic")
  assert os.path.basename(workdir) == "synthetic-ablation-abs-seed0"
  assert os.listdir(os.path.join(workdir, "eval")) == ["t.txt"]
  results.check_publish_keeps(str(published_dir), out, table="ablation", task="synthetic")
  [run] = results.collect(out)
  assert run["workdir"] == os.path.join("runs", "synthetic-ablation-abs-seed0")


def test_two_folders_holding_one_run_are_refused_not_counted_as_two_seeds(tmp_path):
  for name in ("ablation-abs-seed0", "synthetic-ablation-abs-seed0"):
    path = tmp_path / results.RUNS_DIR / name / results.RESULT_FILE
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(_abs_result(f"runs/{name}")))
  with pytest.raises(
      ValueError, match=re.escape(
          "runs/ablation-abs-seed0 and runs/synthetic-ablation-abs-seed0 both hold a result of row "
          "abs seed 0 (ablation on synthetic): move one out of")):
    results.collect(str(tmp_path))


def _published_abs_run(published_dir, folder: str, workdir: str) -> str:
  """Writes `published_dir`/results.json holding one finished run, synthetic ablation `abs`
  seed 0 run in `workdir`, with its translations under `folder`; returns its path."""
  translations = published_dir / results.TRANSLATIONS_DIR / folder
  translations.mkdir(parents=True)
  (translations / "t.txt").write_text("x\n")
  published = published_dir / "results.json"
  published.write_text(json.dumps({"runs": [_abs_result(workdir)]}))
  return str(published)


def _abs_result(workdir: str) -> dict:
  return {
      "table": "ablation", "row": "abs", "seed": 0, "task": "synthetic", "scores": {}, "config": {},
      "workdir": workdir
  }


def test_rows_off_the_tables_lists_follow_them_a_k_by_its_number(tmp_path):
  for row, seed in (("k=12", 0), ("k=3", 1), ("k=1", 0), ("k=3", 0)):
    name = f"synthetic-k_sweep-{row.replace('=', '')}-seed{seed}"
    path = tmp_path / results.RUNS_DIR / name / results.RESULT_FILE
    path.parent.mkdir(parents=True)
    path.write_text(
        json.dumps({
            **_abs_result(f"runs/{name}"), "table": "k_sweep", "row": row, "seed": seed,
            "k": int(row[2:])
        }))
  assert [(r["row"], r["seed"]) for r in results.collect(str(tmp_path))
         ] == [("k=1", 0), ("k=3", 0), ("k=3", 1), ("k=12", 0)]  # k=1 is of the paper's grid


def test_publishing_over_another_experiments_run_is_refused(tmp_path):
  """A --publish_to folder of the same table and run names, made with other settings (3,000
  steps there, 12 here), was replaced silently."""
  from configs import tiny  # pylint: disable=import-outside-toplevel
  name = "synthetic-ablation-abs-seed0"
  made = lambda steps: {
      **_abs_result(f"runs/{name}"), "config": {
          **tiny.get_config().to_dict(), "train":
              {**tiny.get_config().train.to_dict(), "num_steps": steps}
      }
  }
  published_dir = tmp_path / "published"
  published_dir.mkdir()
  (published_dir / "results.json").write_text(json.dumps({"runs": [made(3000)]}))
  local = tmp_path / "out" / results.RUNS_DIR / name / results.RESULT_FILE
  local.parent.mkdir(parents=True)
  local.write_text(json.dumps(made(3000)))
  results.check_publish_keeps(str(published_dir), str(tmp_path / "out"), table="ablation",
                              task="synthetic")  # the same run: kept
  local.write_text(json.dumps(made(12)))
  with pytest.raises(
      ValueError, match=re.escape(
          f"--publish_to {published_dir} holds {name} made with train.num_steps=3000, and "
          f"{tmp_path / 'out'} one made with 12: publishing would replace another experiment's")):
    results.check_publish_keeps(str(published_dir), str(tmp_path / "out"), table="ablation",
                                task="synthetic")
