"""Tests for relpos.checkpoint_schedule: the steps saved on schedule, and a manager that keeps
the last of them however many stops saved checkpoints in between."""
import functools

import grain
import jax.numpy as jnp
import ml_collections

from relpos import checkpoint_schedule
from relpos import checkpoints


def test_average_leaves_out_checkpoints_saved_on_sigterm_in_between():
  """A run stopped at step 552 and resumed keeps that checkpoint a while: average:N takes the
  steps an uninterrupted run saves (multiples of the checkpoint or evaluation interval, and the
  last step), so both average the same parameters."""
  train_config = ml_collections.ConfigDict(
      {"checkpoint_every_steps": 100, "eval_every_steps": 500, "num_steps": 1050})
  assert checkpoint_schedule.scheduled_steps([552, 500, 600, 700, 1000, 1050, 1051],
                                             train_config) == [500, 600, 700, 1000, 1050]
  train_config.checkpoint_every_steps = 300
  assert checkpoint_schedule.scheduled_steps([300, 500, 552, 600], train_config) == [300, 500, 600]
  assert not checkpoint_schedule.on_schedule(552, train_config)


def test_the_count_on_schedule_is_that_of_the_steps_listed():
  for every, evaluations, steps in ((500, 500, 1000), (100, 500, 1050), (300, 500, 1000),
                                    (7, 3, 50), (4, 100, 12), (1000, 1000, 999)):
    train_config = ml_collections.ConfigDict(
        {"checkpoint_every_steps": every, "eval_every_steps": evaluations, "num_steps": steps})
    listed = checkpoint_schedule.scheduled_steps(range(1, steps + 1), train_config)
    assert checkpoint_schedule.count_on_schedule(train_config) == len(listed)


def _save(manager, steps):
  iterator = iter(grain.MapDataset.range(4).to_iter_dataset())
  for step in steps:
    checkpoints.save(manager, {"step": jnp.int32(step), "params": {"w": jnp.zeros(2)}}, iterator)
    checkpoints.wait(manager)


def test_a_stop_between_checkpoints_keeps_the_last_ones_on_schedule(tmp_path):
  """keep=2, a checkpoint every 4 steps, stopped at 7: Orbax's LatestN kept 7 and 8 and dropped
  4, so average:2 (of 4 and 8) could never be computed. The newest is kept too: a run resumes
  from it."""
  train_config = ml_collections.ConfigDict(
      {"checkpoint_every_steps": 4, "eval_every_steps": 100, "num_steps": 12})
  scheduled = functools.partial(checkpoint_schedule.on_schedule, train_config=train_config)
  manager = checkpoints.make_manager(str(tmp_path), keep=2, scheduled=scheduled)
  _save(manager, [4, 7])
  assert manager.all_steps() == [4, 7]  # 7: the newest, to resume from
  _save(manager, [8])
  assert manager.all_steps() == [4, 8]
  _save(manager, [9, 10])  # two stops in a row: the newer one is kept
  assert manager.all_steps() == [4, 8, 10]
  _save(manager, [12])
  assert manager.all_steps() == [8, 12]
  manager.close()


def test_without_a_schedule_every_step_counts(tmp_path):
  manager = checkpoints.make_manager(str(tmp_path), keep=2)
  _save(manager, [1, 2, 3])
  assert manager.all_steps() == [2, 3]
  manager.close()
