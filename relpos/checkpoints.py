"""Orbax checkpoints of a run: layout, saving, restoring, and the architecture check.

Layout (`<workdir>/checkpoints/<step>/`, written to a temporary folder and renamed when
complete, so a kill mid-write leaves the previous steps intact):

  state/    Orbax `StandardSave` (tensorstore arrays + JSON metadata) of
            {"step", "params", "rng", "opt_state", "num_skipped"} (and "loss_scale" under
            float16, `train_state`); RNG keys as raw uint32 data
  data/     the grain iterator state, `process_<i>-of-<n>.json` (grain's Orbax handler)
  metrics/  JSON validation metrics ("bleu", "loss", ...) of the checkpoints taken at an
            evaluation; the best BLEU (or, without BLEU, lowest loss) is kept

Nothing is pickled. The manager keeps the last `keep` checkpoints plus the best one. A
checkpoint whose files are missing, truncated or unreadable is "damaged"
(`relpos.checkpoint_damage`); `restore_newest` skips such checkpoints for the newest one that
restores. Restore targets carry the shardings of the current mesh, so a checkpoint written on
any number of devices restores on any other.
The model's variables are held as pure nested dicts (`nnx.to_pure_dict`): "params" (nnx.Param)
and "rng" (nnx.RngState, the dropout stream), which `nnx.merge` turns back into a model.
"""
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

import grain
import grain.checkpoint as grain_checkpoint
import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from flax import nnx
from jax.experimental import multihost_utils
from orbax.checkpoint import checkpoint_managers

from relpos import checkpoint_damage
from relpos import checkpoint_data
from relpos import checkpoint_schedule
from relpos import distributed
from relpos import model as model_lib
from relpos import model_config
from relpos import workdir_files

PyTree = Any
Restored = TypeVar("Restored")
STATE_METADATA = os.path.join("state", "_METADATA")
METRICS_FILE = os.path.join("metrics", "metrics")  # a checkpoint's validation BLEU (Orbax's)


def best_metric(metrics: dict[str, float]) -> float:
  """The quality of a checkpoint: validation BLEU, or minus the loss when BLEU was not run."""
  return metrics["bleu"] if "bleu" in metrics else -metrics["loss"]


def checkpoint_dir(workdir: str) -> str:
  """The absolute path of a run's checkpoint folder, `<workdir>/checkpoints`."""
  return os.path.join(os.path.abspath(workdir), workdir_files.CHECKPOINT_DIR)


def make_manager(workdir: str, *, keep: int = 1, read_only: bool = False,
                 scheduled: Callable[[int], bool] | None = None) -> ocp.CheckpointManager:
  """Opens the CheckpointManager of `workdir/checkpoints`.

  Args:
    workdir: the run's folder.
    keep: how many of the latest checkpoints saved on schedule to keep (the newest and the
      best one are kept besides: `checkpoint_schedule.LatestOnSchedule`).
    read_only: open for restoring only (evaluation): nothing is created or deleted.
    scheduled: whether a step is saved on schedule (`checkpoint_schedule.on_schedule`);
      None: every step.

  Raises:
    ValueError: `workdir/checkpoints` exists and is not a folder (naming it).
    checkpoint_damage.DamagedCheckpointError: a checkpoint's metrics file is empty or not JSON
      (naming it; Orbax reads every checkpoint's as the manager opens, and fails on one):
      training sets such checkpoints aside first (`set_aside_damaged_metrics`).
  """
  directory = checkpoint_dir(workdir)
  if os.path.exists(directory) and not os.path.isdir(directory):
    raise ValueError(f"{directory} is a file, not a folder of checkpoints: move it aside or "
                     "pass another --workdir.")
  _refuse_damaged_metrics(directory)
  policy = checkpoint_managers.AnyPreservationPolicy([
      checkpoint_schedule.LatestOnSchedule(n=keep, scheduled=scheduled or (lambda step: True)),
      checkpoint_managers.BestN(get_metric_fn=best_metric, n=1,
                                keep_checkpoints_without_metrics=False),
  ])
  options = ocp.CheckpointManagerOptions(best_fn=best_metric, best_mode="max",
                                         preservation_policy=policy, read_only=read_only,
                                         save_interval_steps=0 if read_only else 1,
                                         create=not read_only,
                                         cleanup_tmp_directories=not read_only)
  handlers = {
      "state": ocp.StandardCheckpointHandler(), "data": grain_checkpoint.CheckpointHandler()
  }
  return ocp.CheckpointManager(directory, item_handlers=handlers, options=options)


def _damaged_metrics(directory: str) -> dict[int, str]:
  """The checkpoints in `directory` whose metrics file (`METRICS_FILE`) is there but empty or
  not JSON: step -> what is wrong. A checkpoint without one is saved without metrics."""
  damaged = {}
  for name in sorted(os.listdir(directory) if os.path.isdir(directory) else []):
    where = os.path.join(directory, name)
    if name.isdigit() and os.path.lexists(os.path.join(where, METRICS_FILE)):
      if problem := checkpoint_damage.json_problem(where, METRICS_FILE):
        damaged[int(name)] = f"checkpoint {where} is damaged: {problem}."
  return damaged


def set_aside_damaged_metrics(workdir: str) -> None:
  """Moves the checkpoints of `workdir` whose metrics file is damaged aside (`set_aside`), on
  process 0 (the others wait), before any manager opens: training's first step."""
  directory = checkpoint_dir(workdir)
  distributed.on_process_0(lambda: _move_aside(directory, _damaged_metrics(directory)),
                           "setting checkpoints with damaged metrics aside")


def _refuse_damaged_metrics(directory: str) -> None:
  """Raises DamagedCheckpointError naming the first checkpoint with a damaged metrics file, for
  a reader that may not move it (evaluation)."""
  for problem in _damaged_metrics(directory).values():
    raise checkpoint_damage.DamagedCheckpointError(
        f"{problem[:-1]}: nothing can be read from {directory} until it is moved out (train.py "
        f"on this --workdir sets it aside into {workdir_files.DAMAGED_DIR}/).")


def newest_step(workdir: str) -> int | None:
  """The step of the newest checkpoint in `workdir` as training and evaluation list them (a
  read-only `make_manager`: a save in flight is not one, nothing is created), or None."""
  manager = make_manager(workdir, read_only=True)
  try:
    return max(manager.all_steps(), default=None)
  finally:
    manager.close()


def _is_key(x: Any) -> bool:
  return jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key)


def keys_to_data(tree: PyTree) -> PyTree:
  """Typed PRNG keys -> their raw uint32 data (storable); other leaves unchanged.

  Works on arrays and on jax.ShapeDtypeStruct leaves (keeping their sharding).
  """
  def convert(x):
    if not _is_key(x):
      return x
    if isinstance(x, jax.ShapeDtypeStruct):
      data = jax.eval_shape(jax.random.key_data, x)
      return jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=x.sharding)
    return jax.random.key_data(x)

  return jax.tree.map(convert, tree)


def data_to_keys(tree: PyTree, like: PyTree) -> PyTree:
  """Inverse of `keys_to_data`: wraps (default PRNG impl) the leaves that are keys in `like`."""
  return jax.tree.map(lambda x, t: jax.random.wrap_key_data(x) if _is_key(t) else x, tree, like)


def save(manager: ocp.CheckpointManager, state: dict[str, PyTree],
         data_iterator: grain.DatasetIterator, *, metrics: dict[str, float] | None = None) -> None:
  """Starts saving `state` (and the iterator position) at `state["step"]`; returns at once.

  The arrays are copied to host memory before this returns (so their buffers may be donated
  next) and written in the background; the iterator state is read synchronously.

  Raises:
    OSError: this save, or the one before it (still in the background), failed: a full disk,
      a folder that cannot be written (`save_failed`).
  """
  wait(manager)
  step = int(state["step"])
  args = ocp.args.Composite(state=ocp.args.StandardSave(keys_to_data(state)),
                            data=grain_checkpoint.CheckpointSave(data_iterator))
  try:
    manager.save(step, args=args, metrics=metrics, force=True)
  except (OSError, ValueError) as e:
    raise save_failed(manager, step, e) from e


def wait(manager: ocp.CheckpointManager) -> None:
  """Waits until the save in the background (if any) is complete.

  Orbax logs the error of a failed background save, with its traceback, from each thread it
  passes through (`relpos.cli` keeps those records from a user) and raises it here.

  Raises:
    OSError: the save failed (`save_failed`).
  """
  in_flight = manager.latest_step()  # a save in flight is the newest step until it fails
  try:
    manager.wait_until_finished()
  except (OSError, ValueError) as e:
    raise save_failed(manager, in_flight, e) from e


def save_failed(manager: ocp.CheckpointManager, step: int | None, error: BaseException) -> OSError:
  """The error of a failed save: one line naming the checkpoint folder, the step, the cause
  (`short_cause`: a full disk's errno and file) and the last checkpoint kept."""
  saved = sorted(set(manager.all_steps()) - {step})
  kept = (f"the last complete checkpoint is step {saved[-1]}"
          if saved else "no checkpoint was saved before it")
  return OSError(
      f"saving the checkpoint of step {step} in {manager.directory} failed: "
      f"{checkpoint_damage.short_cause(error).rstrip('.')}; {kept}: make room (or fix the "
      "folder) and run the same command again to resume.")


def step_dir(manager: ocp.CheckpointManager, step: int) -> str:
  """The folder of the checkpoint of `step`."""
  return os.path.join(str(manager.directory), str(step))


def check_files(manager: ocp.CheckpointManager, step: int, *, with_data: bool) -> None:
  """Checks the small files of a checkpoint: the state's metadata and (`with_data`) this
  process's iterator state exist and are whole JSON. The arrays are checked by reading them.

  Raises:
    checkpoint_damage.DamagedCheckpointError: naming the first missing, empty or truncated file.
    ValueError: (`with_data`) the iterators were saved by another number of processes.
  """
  where = step_dir(manager, step)
  names = [STATE_METADATA]
  if with_data:
    checkpoint_data.check_process_count(where)
    names.append(os.path.join("data", checkpoint_data.data_file()))
  for name in names:
    problem = checkpoint_damage.json_problem(where, name)
    if problem:
      raise checkpoint_damage.DamagedCheckpointError(f"checkpoint {where} is damaged: {problem}.")


def _none_ready(manager: ocp.CheckpointManager) -> FileNotFoundError:
  return FileNotFoundError(f"no checkpoint is ready in {manager.directory} (a run saves its "
                           "first one after train.checkpoint_every_steps steps).")


def restore_newest(manager: ocp.CheckpointManager,
                   restore_step: Callable[[int], Restored]) -> tuple[int, Restored, list[int]]:
  """Restores the newest checkpoint that restores, skipping (with a warning) damaged ones and
  ones whose folder vanishes while read (removed by a run training in the workdir meanwhile).

  Args:
    manager: from `make_manager`.
    restore_step: restores the checkpoint of a step; raises DamagedCheckpointError when it cannot
      be read.

  Returns:
    (the step restored, what `restore_step` returned, the newer steps found damaged).

  Raises:
    FileNotFoundError: there is no checkpoint.
    checkpoint_damage.DamagedCheckpointError: every checkpoint is damaged (each named).
  """
  damaged = {}
  while (step := agreed(max(set(manager.all_steps()) - set(damaged), default=-1))) >= 0:
    try:
      restored, error = restore_step(step), None
    except checkpoint_damage.DamagedCheckpointError as e:
      restored, error = None, e
    error = _damage_anywhere(manager, step, error)
    if error is None:
      return step, restored, sorted(damaged)
    if os.path.isdir(step_dir(manager, step)):
      damaged[step] = str(error)
      logging.warning("%s Trying the checkpoint before it.", error)
    else:
      logging.warning(
          "Checkpoint %s was deleted while it was read (by the run training "
          "there); trying the one before it.", step_dir(manager, step))
    manager.reload()
  if damaged:
    raise checkpoint_damage.DamagedCheckpointError(
        f"no checkpoint in {manager.directory} can be restored: " + " ".join(damaged.values()))
  raise _none_ready(manager)


def agreed(step: int) -> int:
  """`step` as process 0 chose it (`distributed.from_process_0`). Each process lists the
  checkpoints itself, and one that lists while a training run commits a step sees it where
  another does not: restoring different steps, they would translate a split with two models."""
  return distributed.from_process_0(step)


def _damage_anywhere(
    manager: ocp.CheckpointManager, step: int,
    error: checkpoint_damage.DamagedCheckpointError | None
) -> checkpoint_damage.DamagedCheckpointError | None:
  """What made the checkpoint of `step` unrestorable here (`error`) or, of several processes
  (each reads files of its own), on another: they agree on the step restored, or one would
  train on another state than the others (and then wait in another collective)."""
  if jax.process_count() == 1:
    return error
  restored_everywhere = multihost_utils.process_allgather(np.int32(error is None)).min()
  if error is None and not restored_everywhere:
    return checkpoint_damage.DamagedCheckpointError(
        f"checkpoint {step_dir(manager, step)} is damaged on another process.")
  return error


def _checked_everywhere(manager: ocp.CheckpointManager, step: int, checks: Callable[[],
                                                                                    None]) -> None:
  """Runs this process's `checks` of the checkpoint of `step` (its files, data position,
  architecture); with several processes they agree before any process enters Orbax's restore,
  whose closing barrier one that raised would never reach: damage found on one process raises
  DamagedCheckpointError on every one (`_damage_anywhere`)."""
  try:
    checks()
    error = None
  except checkpoint_damage.DamagedCheckpointError as e:
    error = e
  if (error := _damage_anywhere(manager, step, error)) is not None:
    raise error


def set_aside(manager: ocp.CheckpointManager, steps: list[int]) -> None:
  """Moves the folders of `steps` (damaged checkpoints) to `<workdir>/damaged_checkpoints/`
  (`workdir_files.DAMAGED_DIR`), out of the manager's sight, so that the run can save those steps
  again; nothing is deleted."""
  distributed.on_process_0(  # the others wait for it
      lambda: _move_aside(str(manager.directory), {step: "" for step in steps}),
      "setting damaged checkpoints aside")
  manager.reload()


def _move_aside(directory: str, damaged: dict[int, str]) -> None:
  """Moves the checkpoints `damaged` (step -> what is wrong, logged) of `directory` to
  `<workdir>/damaged_checkpoints/<step>.<time>`."""
  for step, problem in damaged.items():
    target = os.path.join(os.path.dirname(directory), workdir_files.DAMAGED_DIR,
                          f"{step}.{time.strftime('%Y%m%d-%H%M%S')}")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    os.rename(os.path.join(directory, str(step)), target)
    logging.warning("%sMoved the damaged checkpoint of step %d to %s.",
                    f"{problem} " if problem else "", step, target)


def resolve_step(manager: ocp.CheckpointManager, checkpoint: str | int) -> int:
  """The step of `checkpoint`: "latest", "best" (by validation metrics) or a step number.

  Raises:
    FileNotFoundError: no checkpoint, not that step, or (for "best") none evaluated.
    ValueError: `checkpoint` is none of the allowed forms.
  """
  steps = manager.all_steps()
  where = str(manager.directory)
  if not steps:
    raise _none_ready(manager)
  if checkpoint == "latest":
    return manager.latest_step()
  if checkpoint == "best":
    if manager.best_step() is None:
      raise FileNotFoundError(f"no checkpoint in {where} was evaluated (none has validation "
                              f"metrics); saved steps: {sorted(steps)}. Use 'latest' or a step.")
    return manager.best_step()
  if isinstance(checkpoint, int) or (isinstance(checkpoint, str) and checkpoint.isdigit()):
    if int(checkpoint) not in steps:
      raise FileNotFoundError(f"no checkpoint at step {checkpoint} in {where}; "
                              f"saved steps: {sorted(steps)}.")
    return int(checkpoint)
  raise ValueError(f"checkpoint={checkpoint!r}: must be 'latest', 'best' or a step number.")


def _path_str(path: tuple[Any, ...]) -> str:
  return "/".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path)


def _saved_tree(manager: ocp.CheckpointManager, step: int) -> PyTree:
  """The metadata (shape, dtype) of each array of the state saved at `step`.

  Raises:
    checkpoint_damage.DamagedCheckpointError: the metadata cannot be read.
  """
  with checkpoint_damage.reading(step_dir(manager, step)):
    return manager.item_metadata(step)["state"].tree


def check_architecture(manager: ocp.CheckpointManager, step: int, abstract_params: PyTree) -> None:
  """Checks that the parameters saved at `step` have the shapes the current config builds.

  Raises:
    ValueError: naming the first parameter that is missing, extra, or of another shape.
    checkpoint_damage.DamagedCheckpointError: the metadata cannot be read.
  """
  saved = _saved_tree(manager, step)["params"]
  saved_shapes = {
      _path_str(p): tuple(m.shape) for p, m in jax.tree_util.tree_leaves_with_path(saved)
  }
  wanted = {
      _path_str(p): tuple(a.shape) for p, a in jax.tree_util.tree_leaves_with_path(abstract_params)
  }
  where = os.path.join(str(manager.directory), str(step))
  for name, shape in wanted.items():
    if name not in saved_shapes:
      raise ValueError(f"checkpoint {where} has no parameter {name} (shape {shape}) that the "
                       "config builds: the config describes another architecture.")
    if saved_shapes[name] != shape:
      raise ValueError(f"checkpoint {where}: parameter {name} has shape {saved_shapes[name]} but "
                       f"the config builds {shape}: the config describes another architecture.")
  extra = sorted(set(saved_shapes) - set(wanted))
  if extra:
    raise ValueError(f"checkpoint {where} has parameter {extra[0]} (shape "
                     f"{saved_shapes[extra[0]]}) that the config does not build: the config "
                     "describes another architecture.")


def _with_sharding(tree: PyTree, sharding: jax.sharding.Sharding) -> PyTree:
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)


def _as_saved(manager: ocp.CheckpointManager, step: int, sharding: jax.sharding.Sharding) -> PyTree:
  """Restore target of the state saved at `step`: its own shapes and dtypes, laid out with
  `sharding` (never the saved layout, whose devices this process may not have)."""
  return _with_sharding(_saved_tree(manager, step), sharding)


def read_state(workdir: str, step: int | None = None) -> dict[str, PyTree]:
  """The train state saved at `step` (default the latest) as saved: numpy leaves, RNG keys as
  raw data. For inspecting and comparing runs."""
  manager = make_manager(workdir, read_only=True)
  try:
    step = resolve_step(manager, "latest" if step is None else step)
    target = _as_saved(manager, step, jax.sharding.SingleDeviceSharding(jax.local_devices()[0]))
    args = ocp.args.Composite(state=ocp.args.StandardRestore(target))
    return jax.device_get(manager.restore(step, args=args)["state"])
  finally:
    manager.close()


def restore_model(manager: ocp.CheckpointManager, step: int,
                  model_config: model_config.TransformerConfig,
                  sharding: jax.sharding.Sharding) -> model_lib.Transformer:
  """The model saved at `step`, laid out with `sharding`: its parameters and RNG streams (the
  rest of the state is read and dropped, so evaluation needs no optimizer).

  Raises:
    ValueError: naming the first parameter whose shape differs from the config's.
    checkpoint_damage.DamagedCheckpointError: naming what is missing or unreadable.
  """
  graphdef, params, rng = model_lib.abstract_model(model_config)

  def checks():
    check_files(manager, step, with_data=False)
    check_architecture(manager, step, params)

  _checked_everywhere(manager, step, checks)
  target = dict(_as_saved(manager, step, sharding))
  target.update(params=_with_sharding(params, sharding),
                rng=keys_to_data(_with_sharding(rng, sharding)))
  with checkpoint_damage.reading(step_dir(manager, step)):
    restored = manager.restore(step,
                               args=ocp.args.Composite(state=ocp.args.StandardRestore(target)))
  return nnx.merge(graphdef, restored["state"]["params"],
                   data_to_keys(restored["state"]["rng"], rng))


def restore(manager: ocp.CheckpointManager, step: int, abstract_state: dict[str, PyTree],
            data_iterator: grain.DatasetIterator) -> dict[str, PyTree]:
  """Restores the train state saved at `step` and the data iterator's position.

  Args:
    manager: from `make_manager`.
    step: a saved step.
    abstract_state: jax.ShapeDtypeStruct leaves (with shardings) of the state to restore;
      PRNG keys as typed keys.
    data_iterator: set in place to the position saved at `step`.

  Returns:
    The state, laid out with the shardings of `abstract_state`.

  Raises:
    ValueError: naming the first parameter whose shape differs from the config's, the number
      of processes to resume with, or a data position of another pipeline.
    checkpoint_damage.DamagedCheckpointError: naming what is missing or unreadable.
  """
  def checks():
    check_files(manager, step, with_data=True)
    checkpoint_data.check_data_position(step_dir(manager, step), data_iterator)
    check_architecture(manager, step, abstract_state["params"])

  _checked_everywhere(manager, step, checks)
  with checkpoint_damage.reading(step_dir(manager, step)):
    restored = manager.restore(
        step, args=ocp.args.Composite(state=ocp.args.StandardRestore(keys_to_data(abstract_state)),
                                      data=grain_checkpoint.CheckpointRestore(data_iterator)))
  return data_to_keys(restored["state"], abstract_state)
