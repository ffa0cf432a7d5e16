"""Training: train state, optimizer, jit steps data-parallel over a device mesh, and the loop.

`train_and_evaluate(config, workdir)` validates the config, restores the latest checkpoint of
`workdir` when there is one (exact resume: parameters, optimizer state, step, dropout RNG and
the data iterator position), trains with periodic evaluation (loss, token accuracy and, with
`decode.validation_bleu`, beam-search sacreBLEU through `relpos.evaluate`, the code eval.py
runs), writes `config.json`, `metrics.jsonl` and TensorBoard events, and saves Orbax
checkpoints (`relpos.checkpoints`). On SIGTERM it saves and returns (`preempted: True`); on
SIGINT (Ctrl-C) it saves and raises KeyboardInterrupt.

The train state is a dict of pure pytrees, the layout checkpoints hold:
  step         int32 []: updates taken (skipped non-finite ones included)
  params       the model's nnx.Param values (nested dict)
  rng          the model's RNG streams (nnx.RngState: dropout key and count)
  opt_state    optax state
  num_skipped  int32 []: updates skipped for a non-finite loss or gradient
  loss_scale   only under model.dtype='float16': {"scale": float32 [], "good_steps": int32 []},
               the dynamic loss scale (see `update_loss_scale`)

Under `model.dtype` bfloat16 or float16 the parameters, optimizer state, logits and loss stay
float32; float16's narrow range needs the loss scaled up before differentiation (gradients of
small activations would flush to zero) and the gradients scaled back down.
"""
import functools
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import grain
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import orbax.checkpoint as ocp
import tqdm
from absl import logging
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from relpos import checkpoints
from relpos import device_mesh
from relpos import evaluate
from relpos import locks
from relpos import metrics_writer
from relpos import model as model_lib
from relpos import run_config
from relpos import source_tree
from relpos import user_modules
from relpos.data import pipeline
from relpos.data import tokenizer as tokenizer_lib
from relpos.preemption import Preemption

TrainState = dict[str, Any]
Batch = dict[str, jax.Array]
VALIDATION_SPLIT = "validation"


class NonFiniteError(FloatingPointError):
  """A non-finite loss, gradient or updated parameters with `train.nonfinite='raise'`, or too
  many skipped updates with 'skip'."""


# --- optimizer and loss ------------------------------------------------------------------------


def learning_rate_schedule(train_config: ml_collections.ConfigDict) -> optax.Schedule:
  """Linear warm-up to `learning_rate`, then inverse square root decay (Vaswani et al. 2017).

  lr(count) = learning_rate * min(s / warmup, sqrt(warmup / s)) with s = count + 1, so the
  first update uses learning_rate / warmup and update `warmup` the peak.
  """
  peak, warmup = train_config.learning_rate, train_config.warmup_steps

  def schedule(count: jax.Array) -> jax.Array:
    s = jnp.asarray(count, jnp.float32) + 1.0
    return peak * jnp.minimum(s / warmup, jnp.sqrt(warmup / s))

  return schedule


def make_optimizer(train_config: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """Adam (b1, b2, eps of the config), optional global-norm clipping and decoupled weight decay
  (matrices only), scaled by `learning_rate_schedule`."""
  transforms = []
  if train_config.grad_clip_norm > 0:
    transforms.append(optax.clip_by_global_norm(train_config.grad_clip_norm))
  transforms.append(optax.scale_by_adam(b1=train_config.adam_b1, b2=train_config.adam_b2,
                                        eps=train_config.adam_eps))
  if train_config.weight_decay > 0:
    transforms.append(optax.add_decayed_weights(
        train_config.weight_decay, mask=lambda params: jax.tree.map(lambda p: p.ndim > 1, params)))
  transforms.append(optax.scale_by_learning_rate(learning_rate_schedule(train_config)))
  return optax.chain(*transforms)


def cross_entropy(logits: jax.Array, targets: jax.Array, *,
                  label_smoothing: float = 0.0) -> tuple[jax.Array, jax.Array]:
  """Label-smoothed cross-entropy summed over the non-padding target tokens.

  The smoothed target puts 1 - label_smoothing on the target and spreads the rest evenly over
  the other vocab entries; the entropy of that distribution is subtracted, so a perfect
  prediction has loss 0.

  Args:
    logits: float [batch, length, vocab].
    targets: int32 [batch, length]; PAD_ID marks padding (weight 0).
    label_smoothing: in [0, 1).

  Returns:
    (loss_sum, weight_sum): float32 scalars, the summed loss and the number of target tokens.
  """
  vocab_size = logits.shape[-1]
  confidence = 1.0 - label_smoothing
  low = label_smoothing / (vocab_size - 1)
  entropy = -(confidence * np.log(confidence) + (vocab_size - 1) * low * np.log(low + 1e-20))
  soft_targets = jax.nn.one_hot(targets, vocab_size) * (confidence - low) + low
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32))
  loss = -jnp.sum(soft_targets * log_probs, axis=-1) - entropy
  weights = (targets != tokenizer_lib.PAD_ID).astype(jnp.float32)
  return jnp.sum(loss * weights), jnp.sum(weights)


# Dynamic loss scaling (float16): start high, halve on an overflow (the update is skipped),
# double after LOSS_SCALE_PERIOD updates without one, as in PyTorch's GradScaler and jmp.
INITIAL_LOSS_SCALE = 2.0 ** 15
LOSS_SCALE_PERIOD = 2000


def initial_loss_scale() -> dict[str, jax.Array]:
  return {"scale": jnp.asarray(INITIAL_LOSS_SCALE, jnp.float32),
          "good_steps": jnp.zeros((), jnp.int32)}


def update_loss_scale(loss_scale: dict[str, jax.Array],
                      grads_finite: jax.Array) -> dict[str, jax.Array]:
  """The loss scale after an update whose unscaled gradients were finite or not."""
  good_steps = jnp.where(grads_finite, loss_scale["good_steps"] + 1, 0)
  grow = good_steps >= LOSS_SCALE_PERIOD
  scale = jnp.where(grads_finite, jnp.where(grow, loss_scale["scale"] * 2.0, loss_scale["scale"]),
                    jnp.maximum(loss_scale["scale"] / 2.0, 1.0))
  return {"scale": scale, "good_steps": jnp.where(grow, 0, good_steps)}


# --- model and state ---------------------------------------------------------------------------


def init_train_state(model_config: model_lib.TransformerConfig,
                     optimizer: optax.GradientTransformation, seed: int | jax.Array) -> TrainState:
  """A fresh train state (see the module docstring for its layout) from an int seed."""
  _, params, rng = model_lib.split_model(model_lib.build_model(model_config, seed))
  state = {"step": jnp.zeros((), jnp.int32), "params": params, "rng": rng,
           "opt_state": optimizer.init(params), "num_skipped": jnp.zeros((), jnp.int32)}
  if model_config.dtype == "float16":
    state["loss_scale"] = initial_loss_scale()
  return state


def model_from_state(graphdef: nnx.GraphDef, state: TrainState) -> model_lib.Transformer:
  """The model with the parameters and RNG streams of `state`."""
  return nnx.merge(graphdef, state["params"], state["rng"])


# --- steps -------------------------------------------------------------------------------------


def _model_kwargs(batch: Batch) -> dict[str, jax.Array]:
  return {"inputs_positions": batch["inputs_position"],
          "targets_positions": batch["targets_position"],
          "inputs_segmentation": batch["inputs_segmentation"],
          "targets_segmentation": batch["targets_segmentation"]}


def micro_batches(batch: Batch, count: int) -> Batch:
  """The batch [rows, length] as `count` micro-batches [count, rows / count, length].

  Micro-batch j holds rows j, j + count, j + 2 * count, ...: each device's contiguous block of
  rows splits into `count` parts of its own, so no row moves between devices.
  """
  return jax.tree.map(lambda x: jnp.swapaxes(x.reshape(-1, count, *x.shape[1:]), 0, 1), batch)


def _gradients(params: Any, rng: Any, batch: Batch, *, graphdef: nnx.GraphDef,
               label_smoothing: float, accumulation_steps: int,
               loss_scale: jax.Array | None) -> tuple[jax.Array, Any, Any]:
  """(loss per target token, its gradient, the RNG streams after dropout) of a global batch.

  With `accumulation_steps` > 1 the batch is split by `micro_batches` and the gradients summed
  over a `lax.scan`: each micro-batch's loss sum is divided by the whole batch's token count, so
  the result is the gradient of the same mean loss, with the activations of one micro-batch in
  memory at a time. Under a float16 `loss_scale` the loss is differentiated scaled and the
  gradient scaled back.
  """
  tokens = jnp.sum((batch["targets"] != tokenizer_lib.PAD_ID).astype(jnp.float32))

  def loss_fn(params, rng, micro):
    model = nnx.merge(graphdef, params, rng)
    logits = model(micro["inputs"], micro["targets"], deterministic=False, **_model_kwargs(micro))
    loss_sum, _ = cross_entropy(logits, micro["targets"], label_smoothing=label_smoothing)
    loss = loss_sum / tokens
    scaled = loss if loss_scale is None else loss * loss_scale
    return scaled, (loss, nnx.to_pure_dict(nnx.state(model, nnx.RngState)))

  value_and_grad = jax.value_and_grad(loss_fn, has_aux=True)
  if accumulation_steps == 1:
    (_, (loss, rng)), grads = value_and_grad(params, rng, batch)
  else:
    def accumulate(carry, micro):
      loss, grads, rng = carry
      (_, (micro_loss, rng)), micro_grads = value_and_grad(params, rng, micro)
      return (loss + micro_loss, jax.tree.map(jnp.add, grads, micro_grads), rng), None

    zeros = jax.tree.map(jnp.zeros_like, params)
    (loss, grads, rng), _ = jax.lax.scan(accumulate, (jnp.zeros((), jnp.float32), zeros, rng),
                                         micro_batches(batch, accumulation_steps))
  if loss_scale is not None:
    grads = jax.tree.map(lambda grad: grad / loss_scale, grads)
  return loss, grads, rng


def train_step(state: TrainState, batch: Batch, *, graphdef: nnx.GraphDef,
               optimizer: optax.GradientTransformation, label_smoothing: float,
               accumulation_steps: int = 1) -> tuple[TrainState, dict[str, jax.Array]]:
  """One update on a global batch. Not applied when the loss, the gradient or the updated
  parameters are not finite (parameters whose global norm overflows float32 count as not
  finite: an exploded update).

  Args:
    state: the train state.
    batch: the six batch keys, int32 [batch, length], sharded over the data axis.
    graphdef: the model structure.
    optimizer: from `make_optimizer`.
    label_smoothing: of the training loss.
    accumulation_steps: micro-batches the gradient is accumulated over (`train.grad_accumulation
      _steps`; rows must divide by it times the device count).

  Returns:
    The new state and float32 scalars loss (per target token), grad_norm, param_norm (of the
    updated parameters) and finite (0.0 when the loss, gradient or updated parameters were
    non-finite for a reason other than a float16 loss-scale overflow, which only lowers the
    scale; the update is skipped either way).
  """
  loss_scale = state["loss_scale"]["scale"] if "loss_scale" in state else None
  loss, grads, rng = _gradients(state["params"], state["rng"], batch, graphdef=graphdef,
                                label_smoothing=label_smoothing,
                                accumulation_steps=accumulation_steps, loss_scale=loss_scale)
  grad_norm = optax.global_norm(grads)
  updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
  params = optax.apply_updates(state["params"], updates)
  param_norm = optax.global_norm(params)
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm) & jnp.isfinite(param_norm)
  keep_if_finite = functools.partial(jax.tree.map, lambda new, old: jnp.where(finite, new, old))
  new_state = {"step": state["step"] + 1, "rng": rng,
               "params": keep_if_finite(params, state["params"]),
               "opt_state": keep_if_finite(opt_state, state["opt_state"]),
               "num_skipped": state["num_skipped"] + (~finite).astype(jnp.int32)}
  if loss_scale is not None:
    new_state["loss_scale"] = update_loss_scale(state["loss_scale"], jnp.isfinite(grad_norm))
    # An overflow of the scaled gradient only lowers the scale.
    finite = jnp.isfinite(loss) & (jnp.isfinite(param_norm) | ~jnp.isfinite(grad_norm))
  return new_state, {"loss": loss, "grad_norm": grad_norm, "param_norm": param_norm,
                     "finite": finite.astype(jnp.float32)}


def eval_step(state: TrainState, batch: Batch, *, graphdef: nnx.GraphDef) -> dict[str, jax.Array]:
  """Sums over a batch (padding rows and tokens weigh 0) for loss and token accuracy.

  Returns:
    float32 scalars: loss_sum (plain cross-entropy), correct (argmax == target) and tokens.
  """
  model = model_from_state(graphdef, state)
  logits = model(batch["inputs"], batch["targets"], deterministic=True, **_model_kwargs(batch))
  loss_sum, tokens = cross_entropy(logits, batch["targets"])
  weights = batch["targets"] != tokenizer_lib.PAD_ID
  correct = jnp.sum((jnp.argmax(logits, axis=-1) == batch["targets"]) & weights)
  return {"loss_sum": loss_sum, "correct": correct.astype(jnp.float32), "tokens": tokens}


class Steps:
  """The jit-compiled init, train and eval functions on a mesh (state replicated, batch rows
  split over the data axis).

  Attributes:
    mesh: the device mesh.
    replicated: sharding of the state.
    batch_sharding: sharding of a batch's rows over the data axis.
    graphdef: the model structure.
    init: seed (int) -> a fresh train state.
    train: (state, global batch) -> (state, metrics); the state's buffers are donated.
    eval: (state, global batch) -> metric sums.
  """

  def __init__(self, mesh: Mesh, model_config: model_lib.TransformerConfig,
               train_config: ml_collections.ConfigDict):
    self.mesh = mesh
    self.replicated = NamedSharding(mesh, PartitionSpec())
    self.batch_sharding = NamedSharding(mesh, PartitionSpec(device_mesh.DATA_AXIS))
    self.graphdef, _, _ = model_lib.abstract_model(model_config)
    optimizer = make_optimizer(train_config)
    self.init = jax.jit(functools.partial(init_train_state, model_config, optimizer),
                        out_shardings=self.replicated)
    self.train = jax.jit(
        functools.partial(train_step, graphdef=self.graphdef, optimizer=optimizer,
                          label_smoothing=train_config.label_smoothing,
                          accumulation_steps=train_config.grad_accumulation_steps),
        in_shardings=(self.replicated, self.batch_sharding),
        out_shardings=(self.replicated, self.replicated), donate_argnums=0)
    self.eval = jax.jit(functools.partial(eval_step, graphdef=self.graphdef),
                        in_shardings=(self.replicated, self.batch_sharding),
                        out_shardings=self.replicated)

  def global_batch(self, local_batch: dict[str, np.ndarray]) -> Batch:
    """Assembles this process's rows [rows/process_count, length] into a global batch."""
    return {k: jax.make_array_from_process_local_data(self.batch_sharding,
                                                      np.asarray(local_batch[k]))
            for k in pipeline.BATCH_KEYS}


# The `train.*` fields the compiled steps depend on (not, e.g., num_steps or the intervals).
STEP_FIELDS = ("learning_rate", "warmup_steps", "adam_b1", "adam_b2", "adam_eps",
               "weight_decay", "grad_clip_norm", "label_smoothing", "grad_accumulation_steps")


def get_steps(mesh: Mesh, model_config: model_lib.TransformerConfig,
              train_config: ml_collections.ConfigDict) -> Steps:
  """`Steps`, shared by the runs of one process that differ only outside STEP_FIELDS (e.g. the
  seeds of a table), so they compile once."""
  return _cached_steps(mesh, model_config, tuple((f, train_config[f]) for f in STEP_FIELDS))


@functools.lru_cache(maxsize=4)
def _cached_steps(mesh: Mesh, model_config: model_lib.TransformerConfig,
                  step_fields: tuple[tuple[str, Any], ...]) -> Steps:
  return Steps(mesh, model_config, ml_collections.ConfigDict(dict(step_fields)))


def evaluate_loss(steps: Steps, state: TrainState, batches: Iterator[dict[str, np.ndarray]]
                  ) -> dict[str, float]:
  """Loss per target token, perplexity and token accuracy over eval batches (global rows)."""
  totals = {"loss_sum": 0.0, "correct": 0.0, "tokens": 0.0}
  for batch in batches:
    sums = jax.device_get(steps.eval(state, steps.global_batch(device_mesh.process_rows(batch))))
    totals = {k: totals[k] + float(sums[k]) for k in totals}
  loss = totals["loss_sum"] / totals["tokens"]
  return {"loss": loss, "perplexity": float(np.exp(loss)),
          "accuracy": totals["correct"] / totals["tokens"]}


# --- the loop ----------------------------------------------------------------------------------


def check_divisible(config: run_config.RunConfig) -> None:
  """Batch sizes must split evenly over the devices (and the processes).

  Raises:
    ValueError: naming the field, its value and the device count.
  """
  for field in ("batch_size", "eval_batch_size"):
    value = config.train[field]
    if value % jax.device_count():
      raise ValueError(f"config field train.{field}={value} must be divisible by the number of "
                       f"devices ({jax.device_count()}).")
  micro = config.train.grad_accumulation_steps * jax.device_count()
  if config.train.batch_size % micro:
    raise ValueError(f"config field train.batch_size={config.train.batch_size} must be divisible "
                     f"by train.grad_accumulation_steps={config.train.grad_accumulation_steps} "
                     f"times the number of devices ({jax.device_count()}).")


class _Recorder:
  """Host side of the train metrics: checks finiteness, averages over a log interval.

  Step t's metrics are read after step t + 1 is dispatched, so the host never stalls the
  device except at log, eval and checkpoint steps.
  """

  def __init__(self, train_config: ml_collections.ConfigDict, num_skipped: int,
               progress: tqdm.tqdm, last_checkpoint: Callable[[], Any]):
    """Starts recording.

    Args:
      train_config: `train.*` of the run (nonfinite, max_skipped_fraction, num_steps).
      num_skipped: updates skipped before this start (of a resumed run).
      progress: the progress bar.
      last_checkpoint: returns the step of the latest checkpoint (None before the first).
    """
    self._train_config = train_config
    self._num_skipped = num_skipped
    self._progress = progress
    self._last_checkpoint = last_checkpoint
    self._pending: tuple[int, dict[str, jax.Array]] | None = None
    self._sums = {"loss": 0.0, "grad_norm": 0.0}
    self._count = 0
    self._start: float | None = None  # set when the first step (and its compilation) is done
    self._steps_timed = 0

  def push(self, step: int, metrics: dict[str, jax.Array]) -> None:
    """Records the previous step and holds `metrics` of `step` until the next push or flush."""
    self.flush()
    self._pending = (step, metrics)

  def flush(self) -> None:
    """Reads the held step's metrics.

    Raises:
      NonFiniteError: the held step's update was not finite, in 'raise' mode; or, in 'skip'
        mode, more than `max_skipped_fraction` of the run's steps have been skipped.
    """
    if self._pending is None:
      return
    step, metrics = self._pending
    self._pending = None
    metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
    if self._start is None:
      self.restart_clock()
    else:
      self._steps_timed += 1
    self._progress.update(1)
    if not metrics["finite"]:
      self._skip(step, metrics)
      return
    self._sums = {k: self._sums[k] + metrics[k] for k in self._sums}
    self._count += 1
    self._progress.set_postfix(loss=f"{metrics['loss']:.4f}", refresh=False)

  def _skip(self, step: int, metrics: dict[str, float]) -> None:
    """Counts a skipped update, raising when that is not allowed (see `flush`)."""
    last = self._last_checkpoint()
    kept = "no checkpoint was saved yet" if last is None else f"the last checkpoint is step {last}"
    values = (f"loss={metrics['loss']}, grad_norm={metrics['grad_norm']}, "
              f"param_norm={metrics['param_norm']}")
    if self._train_config.nonfinite == "raise":
      raise NonFiniteError(
          f"non-finite loss, gradient or parameters at step {step} ({values}), not saved; "
          f"{kept}. Set train.nonfinite='skip' to skip such updates instead.")
    self._num_skipped += 1
    fraction, num_steps = self._train_config.max_skipped_fraction, self._train_config.num_steps
    if self._num_skipped > fraction * num_steps:
      raise NonFiniteError(
          f"updates skipped for non-finite values: {self._num_skipped} by step {step}, more "
          f"than train.max_skipped_fraction={fraction} of the run's {num_steps} steps (step "
          f"{step}: {values}); {kept}.")

  def restart_clock(self) -> None:
    """Times steps from now: called after the first step (its compilation) and after each
    evaluation or checkpoint, so steps per second count training alone."""
    self._steps_timed, self._start = 0, time.perf_counter()

  def summary(self) -> dict[str, float | None]:
    """Means over the finite steps since the last summary (None when every step was skipped):
    `smoothed_loss` (the label-smoothed training objective per target token; validation's
    `loss` is the plain cross-entropy) and `grad_norm`; and training steps per second (None
    when no step was timed)."""
    self.flush()
    means = {k: v / self._count if self._count else None for k, v in self._sums.items()}
    elapsed = time.perf_counter() - self._start if self._start is not None else 0.0
    summary = {"smoothed_loss": means["loss"], "grad_norm": means["grad_norm"],
               "steps_per_second": self._steps_timed / elapsed if self._steps_timed else None}
    self._sums = {k: 0.0 for k in self._sums}
    self._count = 0
    if self._start is not None:
      self.restart_clock()
    return summary


def _is_multiple(step: int, every: int, last: int) -> bool:
  return step % every == 0 or step == last


def _validate(config: run_config.RunConfig, task: pipeline.Task, steps: Steps,
              state: TrainState) -> dict[str, Any]:
  """Validation loss and accuracy, and beam-search BLEU / chrF when `decode.validation_bleu`."""
  results = evaluate_loss(steps, state, task.eval_batches(VALIDATION_SPLIT,
                                                          config.train.eval_batch_size))
  if config.decode.validation_bleu:
    scores = evaluate.score_split(model_from_state(steps.graphdef, state), task, VALIDATION_SPLIT,
                                  config, mesh=steps.mesh)
    results.update({k: scores[k] for k in ("bleu", "chrf", "signature", "num_sentences")})
  return results


def train_and_evaluate(config: ml_collections.ConfigDict | run_config.RunConfig,
                       workdir: str) -> dict[str, Any]:
  """Trains (or resumes) the run of `config` in `workdir`; see the module docstring.

  Args:
    config: the run config (`configs/`), validated here before any work, or a validated one
      (`relpos.run_config.validate`).
    workdir: folder of the run; created when missing, resumed from when it holds checkpoints.

  Returns:
    {"step", "preempted", "early_stopped", "train": last train summary, "validation": last
    validation metrics, "validation_time_s": seconds this call spent validating}.

  Raises:
    KeyboardInterrupt: after saving, on SIGINT.
    ValueError: an invalid config field (or a position variant of the user's own that fails a
      trial: `model.check_variant`), a workdir that is a file, checkpoints of another
      architecture or tokenizer (`run_config.check_resume`) in `workdir`, or written by another
      number of processes.
    checkpoints.DamagedCheckpointError: every checkpoint in `workdir` is damaged.
    locks.WorkdirInUseError: another process trains in `workdir`.
    NonFiniteError: a non-finite loss, gradient or updated parameters with
      `train.nonfinite='raise'`; with 'skip', more than `train.max_skipped_fraction` of the
      steps skipped.
  """
  started = time.perf_counter()
  if not isinstance(config, run_config.RunConfig):
    config = run_config.validate(config)
  check_divisible(config)
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise ValueError(f"workdir {workdir} exists and is not a folder.")
  os.makedirs(workdir, exist_ok=True)
  with locks.hold(workdir):
    manager = checkpoints.make_manager(workdir, keep=config.train.keep_checkpoints)
    try:
      run_config.check_resume(config, workdir, resuming=manager.latest_step() is not None)
      task = pipeline.get_task(config.task)
      steps = get_steps(device_mesh.make_mesh(), config.model, config.train)
      train_iterator = task.train_iterator(config.train.batch_size, seed=config.seed,
                                           shard_index=jax.process_index(),
                                           shard_count=jax.process_count())
      state = _initial_state(config, steps, manager, train_iterator)
      metrics_writer.read_metrics(workdir)  # a damaged metrics.jsonl stops before any write
      run_config.write(config, workdir)
      user_modules.write_imports(workdir)
      metrics_writer.record_start(workdir, int(state["step"]), source_tree.commit())
      return _train_loop(config, workdir, task, steps, state, manager, train_iterator, started)
    finally:
      manager.close()


def _initial_state(config: run_config.RunConfig, steps: Steps,
                   manager: ocp.CheckpointManager,
                   train_iterator: grain.DatasetIterator) -> TrainState:
  """The newest restorable checkpoint's state (iterator restored in place), or a fresh one.

  Newer checkpoints found damaged are moved aside (`checkpoints.set_aside`), so that the run
  can save their steps again.
  """
  if manager.latest_step() is None:
    return steps.init(config.seed)
  abstract = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=steps.replicated),
      jax.eval_shape(steps.init, config.seed))
  step, state, damaged = checkpoints.restore_newest(
      manager, lambda s: checkpoints.restore(manager, s, abstract, train_iterator))
  checkpoints.set_aside(manager, damaged)
  logging.warning("Resuming from step %d (%s).", step, manager.directory)
  return state


def evaluations_since_best(validation: list[dict[str, Any]]) -> int:
  """How many evaluations came after the best one (by `checkpoints.best_metric`: validation BLEU,
  else minus the loss); 0 when the last one is the best or there is none."""
  best, since = None, 0
  for metrics in validation:
    quality = checkpoints.best_metric(metrics)
    if best is None or quality > best:
      best, since = quality, 0
    else:
      since += 1
  return since


def _validation_history(workdir: str, up_to_step: int) -> list[dict[str, Any]]:
  """The validation metrics metrics.jsonl holds for steps up to `up_to_step`, in order."""
  return [record for record in metrics_writer.read_metrics(workdir)
          if record["split"] == VALIDATION_SPLIT and record["step"] <= up_to_step]


def _last_records(workdir: str) -> dict[str, dict[str, Any]]:
  """Split -> the metrics of its last record in metrics.jsonl (without step and split)."""
  last = {}
  for record in metrics_writer.read_metrics(workdir):
    last[record["split"]] = {k: v for k, v in record.items() if k not in ("step", "split")}
  return last


def _train_summary(recorder: _Recorder, state: TrainState, schedule: optax.Schedule,
                   elapsed_s: float) -> dict[str, float]:
  """Means since the last summary, skipped updates so far, the next update's rate and the
  run's seconds so far (`metrics_writer.elapsed_seconds`)."""
  num_skipped = int(state["num_skipped"])
  return {**recorder.summary(), "skipped_updates": num_skipped,
          "learning_rate": float(schedule(int(state["step"]) - num_skipped)),
          "elapsed_s": elapsed_s}


def _train_loop(config: run_config.RunConfig, workdir: str, task: pipeline.Task,
                steps: Steps, state: TrainState, manager: ocp.CheckpointManager,
                train_iterator: grain.DatasetIterator, started: float) -> dict[str, Any]:
  """Runs steps from `state["step"]` to `train.num_steps`; see `train_and_evaluate`.

  `started` (time.perf_counter) is when this start of the run began: train records count the
  run's seconds from it, on top of those its earlier starts took to reach `state["step"]`.

  Train metrics are logged every `log_every_steps` and at every checkpoint, so a run resumed
  from a checkpoint averages over the same intervals as an uninterrupted one. With
  `train.early_stopping_patience` = P > 0 the run stops (saved, `early_stopped: True`) at the
  first evaluation that is the P-th in a row without a better validation BLEU.
  """
  train_config = config.train
  first, last = int(state["step"]), train_config.num_steps
  schedule = learning_rate_schedule(train_config)
  last_records = _last_records(workdir)
  validation_history = _validation_history(workdir, first)
  earlier_s = metrics_writer.elapsed_seconds(
      [r for r in metrics_writer.read_metrics(workdir) if r["step"] <= first])
  result = {"step": first, "preempted": False, "early_stopped": False,
            "train": last_records.get("train", {}),
            "validation": last_records.get(VALIDATION_SPLIT, {}), "validation_time_s": 0.0}
  progress = tqdm.tqdm(total=last, initial=first, unit="step", dynamic_ncols=True,
                       disable=jax.process_index() != 0)
  recorder = _Recorder(train_config, int(state["num_skipped"]), progress, manager.latest_step)
  with (progress, Preemption() as preemption,
        metrics_writer.MetricsWriter(workdir, resume_step=first) as writer):
    for step in range(first + 1, last + 1):
      state, metrics = steps.train(state, steps.global_batch(next(train_iterator)))
      recorder.push(step, metrics)
      preempted = preemption.reached(step)
      evaluate_now = _is_multiple(step, train_config.eval_every_steps, last)
      save_now = (evaluate_now or preempted
                  or _is_multiple(step, train_config.checkpoint_every_steps, last))
      if save_now or step % train_config.log_every_steps == 0:
        result["train"] = _train_summary(recorder, state, schedule,
                                         earlier_s + time.perf_counter() - started)
        writer.write(step, "train", result["train"])
      eval_metrics = None
      if evaluate_now:
        start = time.perf_counter()
        eval_metrics = result["validation"] = {
            **_validate(config, task, steps, state), "time_s": time.perf_counter() - start}
        result["validation_time_s"] += eval_metrics["time_s"]
        writer.write(step, VALIDATION_SPLIT, eval_metrics)
        validation_history.append(eval_metrics)
      if save_now:
        checkpoints.save(manager, state, train_iterator, metrics=_checkpoint_metrics(eval_metrics))
      if evaluate_now or save_now:
        recorder.restart_clock()
      result["step"] = step
      patience = train_config.early_stopping_patience
      if evaluate_now and patience and evaluations_since_best(validation_history) >= patience:
        logging.warning("Early stop at step %d: %d evaluations without a better validation %s.",
                        step, patience, "BLEU" if "bleu" in eval_metrics else "loss")
        result["early_stopped"] = True
        break
      if preempted:
        logging.warning("Preempted: saved step %d to %s.", step, manager.directory)
        result["preempted"] = True
        break
    recorder.flush()
  checkpoints.wait(manager)
  if preemption.signal == "SIGINT":
    raise KeyboardInterrupt(f"saved step {result['step']} to {manager.directory}; run the same "
                            "command again to resume.")
  return result


def _checkpoint_metrics(eval_metrics: dict[str, Any] | None) -> dict[str, float] | None:
  """The numbers `checkpoints.best_metric` ranks by."""
  if eval_metrics is None:
    return None
  return {k: eval_metrics[k] for k in ("bleu", "loss") if k in eval_metrics}
