"""Seeds trained as one program (`relpos.seed_stack`) against one seed after another.

For each model of the train-step benchmark (the `abs` row, the same batch): one seed's compiled
train step on a batch [rows, length], and the same step vmapped over a row's seeds
(`seed_stack.stacked_train`) on a batch [seeds, rows, length], every seed given the same rows
(the time does not depend on the tokens). The gain is seeds x (one seed's step) / (the stacked
step): above 1, stacking trains a row's seeds in less time than one after another.
"""
from typing import Any

import jax

from benchmarks import common
from benchmarks import train_step
from relpos import seed_stack

SEEDS = 3  # a row's seeds in the tables


def run_task(task: str, *, seeds: int, rounds: int) -> dict[str, Any]:
  """Times one seed's train step and `seeds` seeds' stacked step on `task`'s model.

  Returns:
    {'task', 'seeds', 'batch_size', 'length', 'devices', 'one_seed_seconds', 'stacked_seconds',
    'gain'}.
  """
  one = train_step.compiled_step("abs", task)
  steps = one.steps
  states = seed_stack.stack([steps.init(one.config.seed + s) for s in range(seeds)])
  batch = seed_stack.stacked_batch(steps, [jax.device_get(one.batch)] * seeds)
  stacked = train_step.CompiledStep(
      seed_stack.stacked_train(steps).lower(states, batch).compile(), states, batch, one.config,
      steps)
  common.progress(f"seed stack {task}: timing 1 seed and {seeds} stacked")
  seconds = common.interleaved_medians(
      {"one": train_step.caller(one), "stacked": train_step.caller(stacked)}, rounds=rounds,
      warmup=2)
  return {
      "task": task, "seeds": seeds, "batch_size": one.config.train.batch_size,
      "length": one.config.task.max_length, "devices": len(jax.devices()),
      "one_seed_seconds": seconds["one"], "stacked_seconds": seconds["stacked"],
      "gain": seeds * seconds["one"] / seconds["stacked"]
  }


def run(*, quick: bool = False, rounds: int | None = None) -> dict[str, Any]:
  """The seed-stacking benchmark of both models of the train-step benchmark; see `run_task`."""
  records = [
      run_task(task, seeds=SEEDS, rounds=rounds or (3 if quick else 7))
      for task in train_step.batch_sizes()
  ]
  return {"records": records}
