"""Tests for relpos.seed_stack: seeds trained as one program write what each trained alone
writes, resume after preemption, stop early one by one, and must differ in seed alone."""
import os
import shutil

import jax
import numpy as np
import pytest

from configs import tiny
from relpos import checkpoints
from relpos import metrics_writer
from relpos import preemption
from relpos import run_config
from relpos import seed_stack
from relpos import train

SEEDS = (0, 1)


def seed_config(data_dir: str, seed: int, **train_overrides) -> run_config.RunConfig:
  """configs/tiny.py (12 steps) with `seed`, its data under `data_dir`, validated."""
  config = tiny.get_config()
  config.task.tfds_data_dir = data_dir
  config.seed = seed
  config.train.update(train_overrides)
  return run_config.validate(config)


def workdirs(folder, name: str) -> list[str]:
  return [str(folder / f"{name}_{seed}") for seed in SEEDS]


@pytest.fixture(scope="module")
def stacked(data_dir, tmp_path_factory):
  """(configs, workdirs, results) of seeds 0 and 1 trained as one program, uninterrupted."""
  configs = [seed_config(data_dir, seed) for seed in SEEDS]
  folders = workdirs(tmp_path_factory.mktemp("stacked"), "seed")
  return configs, folders, seed_stack.train_seeds(configs, folders)


def assert_params_close(workdir: str, expected_workdir: str) -> float:
  """Asserts the latest saved parameters of two runs close; returns their largest difference."""
  got, expected = (checkpoints.read_state(w)["params"] for w in (workdir, expected_workdir))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), got, expected)
  return max(
      float(np.max(np.abs(a - b))) for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)))


def assert_records_close(workdir: str, expected_workdir: str) -> None:
  """metrics.jsonl of two runs: the same records (steps, splits, fields), numbers close."""
  got, expected = (metrics_writer.without_timing(metrics_writer.read_metrics(w))
                   for w in (workdir, expected_workdir))
  assert [(r["step"], r["split"], sorted(r)) for r in got
         ] == [(r["step"], r["split"], sorted(r)) for r in expected]
  for record, other in zip(got, expected):
    for key, value in record.items():
      if isinstance(value, float):
        assert value == pytest.approx(other[key], rel=1e-4, abs=1e-6), (record, other)
      else:
        assert value == other[key], (record, other)


def saved_steps(workdir: str) -> list[int]:
  return checkpoints.make_manager(workdir, read_only=True).all_steps()


def test_stacked_seeds_equal_each_trained_alone(stacked, tmp_path):
  configs, folders, results = stacked
  alone = workdirs(tmp_path, "alone")
  alone_results = [train.train_and_evaluate(c, w) for c, w in zip(configs, alone)]
  for config, workdir, result, expected_workdir, expected in zip(configs, folders, results, alone,
                                                                 alone_results):
    assert (result["step"], result["preempted"], result["early_stopped"]) == (12, False, False)
    assert result["validation"]["loss"] == pytest.approx(expected["validation"]["loss"], rel=1e-4)
    assert run_config.load(workdir) == config
    assert [s["step"] for s in metrics_writer.read_starts(workdir)] == [0]
    assert saved_steps(workdir) == saved_steps(expected_workdir)
    assert_records_close(workdir, expected_workdir)
    assert assert_params_close(workdir, expected_workdir) < 1e-5
  # Two seeds trained, not one twice.
  first, second = (checkpoints.read_state(w)["params"] for w in folders)
  assert not all(jax.tree.leaves(jax.tree.map(np.array_equal, first, second)))


def test_preempted_stacked_seeds_resume_as_if_uninterrupted(stacked, data_dir, tmp_path,
                                                            monkeypatch):
  configs, uninterrupted, _ = stacked
  folders = workdirs(tmp_path, "seed")
  with monkeypatch.context() as patch:
    patch.setattr(preemption.Preemption, "reached", lambda self, step: step == 5)
    results = seed_stack.train_seeds(configs, folders)
  assert [(r["step"], r["preempted"]) for r in results] == [(5, True), (5, True)]
  assert [max(saved_steps(w)) for w in folders] == [5, 5]
  alone = str(tmp_path / "alone_0")  # one seed of the stack resumed alone
  shutil.copytree(folders[0], alone)
  assert train.train_and_evaluate(configs[0], alone)["step"] == 12
  assert_params_close(alone, uninterrupted[0])
  results = seed_stack.train_seeds(configs, folders)
  assert [(r["step"], r["preempted"]) for r in results] == [(12, False), (12, False)]
  for workdir, expected in zip(folders, uninterrupted):
    assert [s["step"] for s in metrics_writer.read_starts(workdir)] == [0, 5]
    jax.tree.map(np.testing.assert_array_equal, checkpoints.read_state(workdir),
                 checkpoints.read_state(expected))
    records, expected_records = (
        metrics_writer.without_timing(metrics_writer.read_metrics(w)) for w in (workdir, expected))
    # The preempted start logged step 5 too (and step 6's train record averages from there).
    assert [r["step"] for r in records if r["split"] == "train"] == [2, 4, 5, 6, 8, 10, 12]
    assert ([r for r in records if r["split"] == "validation"
            ] == [r for r in expected_records if r["split"] == "validation"])


def test_configs_differing_in_another_field_than_seed_are_refused(data_dir, tmp_path):
  configs = [seed_config(data_dir, 0), seed_config(data_dir, 1, learning_rate=0.001)]
  with pytest.raises(
      ValueError, match=r"^seeds trained as one program must differ only in seed: "
      r"config field train\.learning_rate is 0\.002 in seed 0's config and 0\.001 "
      r"in seed 1's\.$"):
    seed_stack.train_seeds(configs, workdirs(tmp_path, "seed"))
  assert not os.listdir(tmp_path)


def test_each_seed_stops_early_on_its_own(data_dir, tmp_path, monkeypatch):
  """Seed 0's validation loss stops improving (stops at step 8, as
  test_train.test_early_stopping_after_patience_evaluations); seed 1's improves and it trains
  on alone in the stack, to the parameters it reaches trained alone."""
  losses = {0: iter([3.0, 2.0, 2.5, 2.4, 1.0]), 1: iter([3.0, 2.0, 1.5, 1.4, 1.0])}
  alone_losses = iter([3.0, 2.0, 1.5, 1.4, 1.0])
  monkeypatch.setattr(train, "_validate", lambda config, *_: {"loss": next(losses[config.seed])})
  configs = [
      seed_config(data_dir, seed, num_steps=10, eval_every_steps=2, checkpoint_every_steps=2,
                  early_stopping_patience=2) for seed in SEEDS
  ]
  folders = workdirs(tmp_path, "seed")
  results = seed_stack.train_seeds(configs, folders)
  assert [(r["step"], r["early_stopped"]) for r in results] == [(8, True), (10, False)]
  manager = checkpoints.make_manager(folders[0], read_only=True)
  assert (manager.latest_step(), manager.best_step(), manager.all_steps()) == (8, 4, [4, 6, 8])
  assert max(saved_steps(folders[1])) == 10
  monkeypatch.setattr(train, "_validate", lambda *_: {"loss": next(alone_losses)})
  alone = str(tmp_path / "alone_1")
  assert train.train_and_evaluate(configs[1], alone)["step"] == 10
  assert_params_close(folders[1], alone)
  assert_records_close(folders[1], alone)


def test_a_seed_stopped_early_stays_stopped_when_the_stack_resumes(data_dir, tmp_path, monkeypatch):
  """Both seeds end at step 8, seed 0 stopped early; given 2 more steps, seed 1 trains them
  alone in the stack and seed 0 trains none (its next validation, 1.0, would be its best)."""
  losses = {0: iter([3.0, 2.0, 2.5, 2.4, 1.0]), 1: iter([3.0, 2.0, 1.5, 1.4, 1.0])}
  monkeypatch.setattr(train, "_validate", lambda config, *_: {"loss": next(losses[config.seed])})
  settings = {"eval_every_steps": 2, "checkpoint_every_steps": 2, "early_stopping_patience": 2}
  folders = workdirs(tmp_path, "seed")
  first = seed_stack.train_seeds([seed_config(data_dir, s, num_steps=8, **settings) for s in SEEDS],
                                 folders)
  assert [(r["step"], r["early_stopped"]) for r in first] == [(8, True), (8, False)]
  records = metrics_writer.read_metrics(folders[0])
  more = [seed_config(data_dir, s, num_steps=10, **settings) for s in SEEDS]
  again = seed_stack.train_seeds(more, folders)
  assert [(r["step"], r["early_stopped"]) for r in again] == [(8, True), (10, False)]
  assert metrics_writer.read_metrics(folders[0]) == records and saved_steps(folders[0]) == [4, 6, 8]
  assert next(losses[0]) == 1.0 and max(saved_steps(folders[1])) == 10


def test_length_bucketed_seeds_train_alone(data_dir, tmp_path, monkeypatch, caplog):
  """Unpacked, each seed's batch has its own length; padded to one, dropout would draw other
  masks than the seed alone does: the seeds train one after the other."""
  alone = []
  monkeypatch.setattr(seed_stack.train, "train_and_evaluate", lambda config, workdir: alone.append(
      (config.seed, workdir)) or {})
  configs = [seed_config(data_dir, seed) for seed in SEEDS]
  configs = [
      run_config.validate(c.to_dict() | {"task": c.task.to_dict() | {"packing": False}})
      for c in configs
  ]
  folders = workdirs(tmp_path, "unpacked")
  assert seed_stack.train_seeds(configs, folders) == [{}, {}]
  assert alone == list(zip(SEEDS, folders))
  assert "each seed trains alone, not stacked" in caplog.text


def test_seeds_that_resume_from_different_steps_train_one_by_one(stacked, data_dir, tmp_path,
                                                                 caplog):
  """Seed 0 finished, seed 1 not started: the stack is left (its workdirs closed, their locks
  released) and each seed trains alone; the finished one is not trained again."""
  configs, folders, _ = stacked
  mixed = workdirs(tmp_path, "mixed")
  shutil.copytree(folders[0], mixed[0])
  results = seed_stack.train_seeds(configs, mixed)
  assert "The seeds resume from different steps" in caplog.text
  assert [r["step"] for r in results] == [12, 12]
  assert_params_close(mixed[1], folders[1])  # seed 1 alone, as it trained in the stack
