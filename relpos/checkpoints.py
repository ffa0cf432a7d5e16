"""Orbax checkpoints of a run: layout, saving, restoring, and the architecture check.

Layout (`<workdir>/checkpoints/<step>/`, written to a temporary folder and renamed when
complete, so a kill mid-write leaves the previous steps intact):

  state/    Orbax `StandardSave` (tensorstore arrays + JSON metadata) of
            {"step", "params", "rng", "opt_state", "num_skipped"}; RNG keys as raw uint32 data
  data/     the grain iterator state, `process_<i>-of-<n>.json` (grain's Orbax handler)
  metrics/  JSON validation metrics ("bleu", "loss", ...) of the checkpoints taken at an
            evaluation; the best BLEU (or, without BLEU, lowest loss) is kept

Nothing is pickled. The manager keeps the last `keep` checkpoints plus the best one.
The model's variables are held as pure nested dicts (`nnx.to_pure_dict`): "params" (nnx.Param)
and "rng" (nnx.RngState, the dropout stream), which `nnx.merge` turns back into a model.
"""
import os
from typing import Any

import grain
import grain.checkpoint as grain_checkpoint
import jax
import orbax.checkpoint as ocp
from flax import nnx
from orbax.checkpoint import checkpoint_managers

from relpos import model as model_lib

PyTree = Any
CHECKPOINT_DIR = "checkpoints"


def build_model(model_config: model_lib.TransformerConfig, seed: int) -> model_lib.Transformer:
  """A freshly initialized Transformer: parameters and dropout stream from `seed`."""
  params_key, dropout_key = jax.random.split(jax.random.key(seed))
  return model_lib.Transformer(model_config, rngs=nnx.Rngs(params=params_key, dropout=dropout_key))


def split_model(model: model_lib.Transformer) -> tuple[nnx.GraphDef, PyTree, PyTree]:
  """(graphdef, params, rng) of a model; params and rng as pure nested dicts."""
  graphdef, params, rng = nnx.split(model, nnx.Param, nnx.RngState)
  return graphdef, nnx.to_pure_dict(params), nnx.to_pure_dict(rng)


def abstract_model(model_config: model_lib.TransformerConfig
                   ) -> tuple[nnx.GraphDef, PyTree, PyTree]:
  """`split_model` of the model `model_config` builds, with jax.ShapeDtypeStruct leaves."""
  return split_model(nnx.eval_shape(lambda: build_model(model_config, 0)))


def best_metric(metrics: dict[str, float]) -> float:
  """The quality of a checkpoint: validation BLEU, or minus the loss when BLEU was not run."""
  return metrics["bleu"] if "bleu" in metrics else -metrics["loss"]


def checkpoint_dir(workdir: str) -> str:
  return os.path.join(os.path.abspath(workdir), CHECKPOINT_DIR)


def make_manager(workdir: str, *, keep: int = 1, read_only: bool = False) -> ocp.CheckpointManager:
  """Opens the CheckpointManager of `workdir/checkpoints`.

  Args:
    workdir: the run's folder.
    keep: how many of the latest checkpoints to keep (the best one is kept besides).
    read_only: open for restoring only (evaluation): nothing is created or deleted.
  """
  policy = checkpoint_managers.AnyPreservationPolicy([
      checkpoint_managers.LatestN(n=keep),
      checkpoint_managers.BestN(get_metric_fn=best_metric, n=1,
                                keep_checkpoints_without_metrics=False),
  ])
  options = ocp.CheckpointManagerOptions(
      best_fn=best_metric, best_mode="max", preservation_policy=policy, read_only=read_only,
      save_interval_steps=0 if read_only else 1, create=not read_only,
      cleanup_tmp_directories=not read_only)
  handlers = {"state": ocp.StandardCheckpointHandler(),
              "data": grain_checkpoint.CheckpointHandler()}
  return ocp.CheckpointManager(checkpoint_dir(workdir), item_handlers=handlers, options=options)


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
  """
  step = int(state["step"])
  args = ocp.args.Composite(state=ocp.args.StandardSave(keys_to_data(state)),
                            data=grain_checkpoint.CheckpointSave(data_iterator))
  manager.save(step, args=args, metrics=metrics, force=True)


def resolve_step(manager: ocp.CheckpointManager, checkpoint: str | int) -> int:
  """The step of `checkpoint`: "latest", "best" (by validation metrics) or a step number.

  Raises:
    FileNotFoundError: no checkpoint, not that step, or (for "best") none evaluated.
    ValueError: `checkpoint` is none of the allowed forms.
  """
  steps = manager.all_steps()
  where = str(manager.directory)
  if not steps:
    raise FileNotFoundError(f"no checkpoint is ready in {where} (a run saves its first one "
                            "after train.checkpoint_every_steps steps).")
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


def check_architecture(manager: ocp.CheckpointManager, step: int, abstract_params: PyTree) -> None:
  """Checks that the parameters saved at `step` have the shapes the current config builds.

  Raises:
    ValueError: naming the first parameter that is missing, extra, or of another shape.
  """
  saved = manager.item_metadata(step)["state"].tree["params"]
  saved_shapes = {_path_str(p): tuple(m.shape)
                  for p, m in jax.tree_util.tree_leaves_with_path(saved)}
  wanted = {_path_str(p): tuple(a.shape)
            for p, a in jax.tree_util.tree_leaves_with_path(abstract_params)}
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


def _as_saved(manager: ocp.CheckpointManager, step: int) -> PyTree:
  """Restore target of the state saved at `step`: its own shapes and dtypes, numpy leaves."""
  saved = manager.item_metadata(step)["state"].tree
  return jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), saved)


def read_state(workdir: str, step: int | None = None) -> dict[str, PyTree]:
  """The train state saved at `step` (default the latest) as saved: numpy leaves, RNG keys as
  raw data. For inspecting and comparing runs."""
  manager = make_manager(workdir, read_only=True)
  try:
    step = resolve_step(manager, "latest" if step is None else step)
    args = ocp.args.Composite(state=ocp.args.StandardRestore(_as_saved(manager, step)))
    return manager.restore(step, args=args)["state"]
  finally:
    manager.close()


def restore_model(manager: ocp.CheckpointManager, step: int,
                  model_config: model_lib.TransformerConfig,
                  sharding: jax.sharding.Sharding) -> model_lib.Transformer:
  """The model saved at `step`: its parameters and RNG streams (the rest of the state is read
  to host memory as saved and dropped, so evaluation needs no optimizer).

  Raises:
    ValueError: naming the first parameter whose shape differs from the config's.
  """
  graphdef, params, rng = abstract_model(model_config)
  check_architecture(manager, step, params)
  target = dict(_as_saved(manager, step))
  target.update(params=_with_sharding(params, sharding),
                rng=keys_to_data(_with_sharding(rng, sharding)))
  restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target)))
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
    ValueError: naming the first parameter whose shape differs from the config's.
  """
  check_architecture(manager, step, abstract_state["params"])
  restored = manager.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(keys_to_data(abstract_state)),
      data=grain_checkpoint.CheckpointRestore(data_iterator)))
  return data_to_keys(restored["state"], abstract_state)
