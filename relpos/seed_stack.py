"""Several seeds of one config trained as one program: `train_seeds`.

The seeds' train states are stacked on a leading seed axis, every leaf [seeds, ...] (the
parameters [seeds, *shape], the optimizer state, the dropout RNG keys [seeds], the step and
skip count [seeds]), and one compiled step, `Steps.train_step` under `jax.vmap`, updates them
all on a batch [seeds, rows, length] of each key (seed s's rows from its own data iterator,
rows split over the mesh's data axis, the state replicated). The host side is each seed's own,
as `relpos.train` runs it (`train.end_step`): in its own workdir, its config.json,
starts.jsonl, metrics.jsonl and checkpoints are those `train.train_and_evaluate` writes, so a
seed resumes alone with it, and eval.py and the tables read it as any run. A seed that stops
early leaves the stack; the others train on.
"""
import contextlib
import functools
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from jax.sharding import NamedSharding, PartitionSpec

from relpos import config_changes
from relpos import checkpoints
from relpos import device_mesh
from relpos import metrics_writer
from relpos import run_config
from relpos import source_tree
from relpos import user_modules
from relpos import steps as steps_lib
from relpos import train
from relpos.data import pipeline
from relpos.preemption import Preemption


def check_same_but_seed(configs: Sequence[run_config.RunConfig]) -> None:
  """Checks that `configs` differ in `seed` alone.

  Raises:
    ValueError: naming the first other field that differs and its two values.
  """
  for config in configs[1:]:
    for field, first, other in config_changes.differences(configs[0], config):
      if field != "seed":
        raise ValueError(f"seeds trained as one program must differ only in seed: config field "
                         f"{field} is {first!r} in seed {configs[0].seed}'s config and {other!r} "
                         f"in seed {config.seed}'s.")


def seeds_batch_sharding(steps: steps_lib.Steps) -> NamedSharding:
  """Sharding of a stacked batch [seeds, rows, length]: rows over the data axis."""
  return NamedSharding(steps.mesh, PartitionSpec(None, device_mesh.DATA_AXIS))


@functools.lru_cache(maxsize=4)
def stacked_train(steps: steps_lib.Steps):
  """(state [seeds, ...], batch [seeds, rows, length]) -> (state, metrics [seeds]) compiled:
  `steps.train_step` vmapped over the seed axis, the batch's rows split over the data axis,
  the state's buffers donated."""
  return jax.jit(jax.vmap(steps.train_step),
                 in_shardings=(steps.replicated, seeds_batch_sharding(steps)),
                 out_shardings=(steps.replicated, steps.replicated), donate_argnums=0)


def stacked_batch(steps: steps_lib.Steps,
                  local_batches: Sequence[dict[str, np.ndarray]]) -> steps_lib.Batch:
  """Each seed's rows of this process [rows/process_count, length], stacked on the host into
  one global batch [seeds, rows, length] per key (one transfer a key, as `Steps.global_batch`
  makes for one seed). Packed batches are all [rows, task.max_length]; length-bucketed ones,
  each of its own length, are never stacked (`train_seeds`)."""
  sharding = seeds_batch_sharding(steps)
  stacked = {k: np.stack([b[k] for b in local_batches]) for k in pipeline.BATCH_KEYS}
  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in stacked.items()}


def stack(trees: Sequence[Any]) -> Any:
  """Trees of the same structure -> one whose leaves are theirs stacked on a new axis 0."""
  return jax.tree.map(lambda *x: jnp.stack(x), *trees)


def unstack(tree: Any, index: int) -> Any:
  """The tree of seed `index` of a stacked tree (axis 0 taken)."""
  return jax.tree.map(lambda x: x[index], tree)


def train_seeds(configs: Sequence[run_config.RunConfig],
                workdirs: Sequence[str]) -> list[dict[str, Any]]:
  """Trains (or resumes) the runs of `configs`, seeds of one config, in `workdirs`, as one
  program; see the module docstring.

  Seeds restored at different steps, or of length-bucketed batches (`task.packing=False`,
  whose dropout masks would change with the padding), are not stacked: each trains alone
  after the other (`train.train_and_evaluate`), with a warning.

  Args:
    configs: validated configs that differ only in `seed`.
    workdirs: the runs' folders, one per config.

  Returns:
    Per seed, what `train.train_and_evaluate` returns: a seed that stopped early says
    early_stopped at its step; on SIGTERM every seed saves and says preempted.

  Raises:
    KeyboardInterrupt: after every seed saved, on SIGINT.
    ValueError: configs that differ in another field than seed (naming it), as many workdirs
      as configs, or what `train.train_and_evaluate` raises for one run.
    checkpoint_damage.DamagedCheckpointError, locks.WorkdirInUseError, recorder.NonFiniteError: as
      `train.train_and_evaluate` for one of the runs.
  """
  started = time.perf_counter()
  if len(configs) != len(workdirs):
    raise ValueError(f"{len(configs)} configs and {len(workdirs)} workdirs: one workdir a seed.")
  check_same_but_seed(configs)
  if not configs[0].task.packing:  # each batch of its own length; dropout's bits depend on it
    logging.warning("Length-bucketed batches (task.packing=False) differ in length from seed to "
                    "seed, and padded to one length they draw other dropout masks: each seed "
                    "trains alone, not stacked.")
    return [train.train_and_evaluate(c, w) for c, w in zip(configs, workdirs)]
  steps = steps_lib.get_steps(device_mesh.make_mesh(), configs[0].model, configs[0].train)
  with contextlib.ExitStack() as stack_of_workdirs:
    opened = [
        stack_of_workdirs.enter_context(train.open_workdir(config, workdir, steps))
        for config, workdir in zip(configs, workdirs)
    ]
    restored = {int(o.state["step"]) for o in opened}
    if len(restored) == 1:
      for workdir, one in zip(workdirs, opened):
        metrics_writer.record_start(workdir, int(one.state["step"]), source_tree.commit(),
                                    user_modules.variant_code(configs[0].model.position),
                                    tokenizer_sha256=one.task.tokenizer.sha256(),
                                    config_changes=one.config_changes)
      return _stacked_loop(configs, workdirs, steps, opened, started)
  logging.warning("The seeds resume from different steps (%s): each trains alone, not stacked.",
                  ", ".join(f"{w}: {int(o.state['step'])}" for w, o in zip(workdirs, opened)))
  return [train.train_and_evaluate(c, w) for c, w in zip(configs, workdirs)]


def _stacked_loop(configs: Sequence[run_config.RunConfig], workdirs: Sequence[str],
                  steps: steps_lib.Steps, opened: Sequence[train.Opened],
                  started: float) -> list[dict[str, Any]]:
  """Runs the seeds' steps from their common step to `train.num_steps` (`train._train_loop`'s
  loop, stacked): after each step, every seed's `train.end_step` on its own state, taken from
  the stack only at a step that logs, evaluates or saves."""
  step_fn = stacked_train(steps)
  first, last = int(opened[0].state["step"]), configs[0].train.num_steps
  state = stack([o.state for o in opened])
  with contextlib.ExitStack() as context:
    progress = [
        context.enter_context(train.progress_bar(first, last, desc=f"seed {c.seed}", position=i))
        for i, c in enumerate(configs)
    ]
    preemption = context.enter_context(Preemption())
    runs = [
        context.enter_context(train.recording(c, w, steps, o, p, started))
        for c, w, o, p in zip(configs, workdirs, opened, progress)
    ]
    # The seeds in the stack, in its order: those that had not stopped early where they resume.
    active = [i for i, run in enumerate(runs) if not train.stopped_early(run)]
    if active and len(active) < len(runs):
      state = unstack(state, jnp.asarray(active))
    for step in range(first + 1, last + 1 if active else first):
      batch = stacked_batch(steps, [next(runs[i].opened.train_iterator) for i in active])
      state, metrics = step_fn(state, batch)
      for position, i in enumerate(active):
        runs[i].records.push(step, unstack(metrics, position))
      preempted = preemption.reached(step)
      any_action = any(train.step_actions(step, configs[0].train, preempted))
      stopped = [
          i for position, i in enumerate(active)
          if train.end_step(runs[i], step,
                            unstack(state, position) if any_action else None, preempted)
      ]
      if stopped:
        kept = [position for position, i in enumerate(active) if i not in stopped]
        active = [active[position] for position in kept]
        if not active:
          break
        state = unstack(state, jnp.asarray(kept))
    for run in runs:
      run.records.flush()
    for run in runs:  # under the handler: a SIGTERM now cuts no save short
      checkpoints.wait(run.opened.manager)
  train.check_interrupted(preemption, runs)
  return [run.result for run in runs]
