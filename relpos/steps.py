"""The jit-compiled train and eval steps, data-parallel over a device mesh.

`Steps` compiles both for one model and optimizer: batches are sharded over the mesh's data
axis, the state replicated. A step accumulates gradients over micro-batches when
`train.grad_accumulation_steps` > 1, and keeps the old state on a non-finite update (the
caller decides to raise or skip).
"""
import functools
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from relpos import device_mesh
from relpos import model as model_lib
from relpos import model_config
from relpos import train_state
from relpos.data import pipeline
from relpos.data import tokenizer as tokenizer_lib

Batch = dict[str, jax.Array]

# --- steps -------------------------------------------------------------------------------------


def _model_kwargs(batch: Batch) -> dict[str, jax.Array]:
  return {
      "inputs_positions": batch["inputs_position"], "targets_positions": batch["targets_position"],
      "inputs_segmentation": batch["inputs_segmentation"],
      "targets_segmentation": batch["targets_segmentation"]
  }


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
    loss_sum, _ = train_state.cross_entropy(logits, micro["targets"],
                                            label_smoothing=label_smoothing)
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


def train_step(state: train_state.TrainState, batch: Batch, *, graphdef: nnx.GraphDef,
               optimizer: optax.GradientTransformation, label_smoothing: float,
               accumulation_steps: int = 1) -> tuple[train_state.TrainState, dict[str, jax.Array]]:
  """One update on a global batch. Not applied when the loss, the gradient or the updated
  parameters are not finite (parameters whose global norm overflows float32 count as not
  finite: an exploded update).

  Args:
    state: the train state.
    batch: the six batch keys, int32 [batch, length], sharded over the data axis.
    graphdef: the model structure.
    optimizer: from `train_state.make_optimizer`.
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
  finite = update_is_finite(loss, grad_norm, param_norm, None)  # else the update is skipped
  # A skip that train.nonfinite rules on (not a float16 loss-scale overflow): `num_skipped`
  # counts these alone, as the recorder does, so a resumed run counts as an uninterrupted one.
  counted = update_is_finite(loss, grad_norm, param_norm, loss_scale)
  keep_if_finite = functools.partial(jax.tree.map, lambda new, old: jnp.where(finite, new, old))
  new_state = {
      "step": state["step"] + 1, "rng": rng, "params": keep_if_finite(params, state["params"]),
      "opt_state": keep_if_finite(opt_state, state["opt_state"]),
      "num_skipped": state["num_skipped"] + (~counted).astype(jnp.int32)
  }
  if loss_scale is not None:
    new_state["loss_scale"] = train_state.update_loss_scale(state["loss_scale"],
                                                            jnp.isfinite(grad_norm))
  return new_state, {
      "loss": loss, "grad_norm": grad_norm, "param_norm": param_norm,
      "finite": counted.astype(jnp.float32)
  }


def update_is_finite(loss: jax.Array, grad_norm: jax.Array, param_norm: jax.Array,
                     loss_scale: jax.Array | None) -> jax.Array:
  """Whether a step's update counts as finite (the recorder raises or skips on one that is
  not): its loss, gradient and updated parameters are finite, except that a float16 gradient
  that overflowed under a loss scale above 1 only lowers the scale. At the scale's floor (1,
  nothing scaled) a non-finite gradient is the model's own: it counts, or every later step
  would be skipped without a word."""
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm) & jnp.isfinite(param_norm)
  if loss_scale is None:
    return finite
  overflow = ~jnp.isfinite(grad_norm) & (loss_scale > 1.0)
  return finite | (jnp.isfinite(loss) & overflow)


def eval_step(state: train_state.TrainState, batch: Batch, *,
              graphdef: nnx.GraphDef) -> dict[str, jax.Array]:
  """Sums over a batch (padding rows and tokens weigh 0) for loss and token accuracy.

  Returns:
    float32 scalars: loss_sum (plain cross-entropy), correct (argmax == target) and tokens.
  """
  model = train_state.model_from_state(graphdef, state)
  logits = model(batch["inputs"], batch["targets"], deterministic=True, **_model_kwargs(batch))
  loss_sum, tokens = train_state.cross_entropy(logits, batch["targets"])
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
    train_step: (state, global batch) -> (state, metrics), `train_step` with this model and
      optimizer, not compiled: what `train` compiles (and `relpos.seed_stack` vmaps).
    train: `train_step` compiled; the state's buffers are donated.
    eval: (state, global batch) -> metric sums.
  """
  def __init__(self, mesh: Mesh, model_config: model_config.TransformerConfig,
               train_config: ml_collections.ConfigDict):
    self.mesh = mesh
    self.replicated = NamedSharding(mesh, PartitionSpec())
    self.batch_sharding = NamedSharding(mesh, PartitionSpec(device_mesh.DATA_AXIS))
    optimizer = train_state.make_optimizer(train_config)
    self.graphdef, _, _ = model_lib.abstract_model(model_config)
    self.init = jax.jit(functools.partial(train_state.init_train_state, model_config, optimizer),
                        out_shardings=self.replicated)
    self.train_step = functools.partial(train_step, graphdef=self.graphdef, optimizer=optimizer,
                                        label_smoothing=train_config.label_smoothing,
                                        accumulation_steps=train_config.grad_accumulation_steps)
    self.train = jax.jit(self.train_step, in_shardings=(self.replicated, self.batch_sharding),
                         out_shardings=(self.replicated, self.replicated), donate_argnums=0)
    self.eval = jax.jit(functools.partial(eval_step, graphdef=self.graphdef),
                        in_shardings=(self.replicated, self.batch_sharding),
                        out_shardings=self.replicated)

  def global_batch(self, local_batch: dict[str, np.ndarray]) -> Batch:
    """Assembles this process's rows [rows/process_count, length] into a global batch."""
    return {
        k: jax.make_array_from_process_local_data(self.batch_sharding, np.asarray(local_batch[k]))
        for k in pipeline.BATCH_KEYS
    }


# The `train.*` fields the compiled steps depend on (not, e.g., num_steps or the intervals).
STEP_FIELDS = ("learning_rate", "warmup_steps", "adam_b1", "adam_b2", "adam_eps", "weight_decay",
               "grad_clip_norm", "label_smoothing", "grad_accumulation_steps")


def get_steps(mesh: Mesh, model_config: model_config.TransformerConfig,
              train_config: ml_collections.ConfigDict) -> Steps:
  """`Steps`, shared by the runs of one process that differ only outside STEP_FIELDS (e.g. the
  seeds of a table), so they compile once.

  Raises:
    ValueError: a batch size of `train_config` that the devices do not divide
      (`check_divisible`).
  """
  check_divisible(train_config)
  return _cached_steps(mesh, model_config, tuple((f, train_config[f]) for f in STEP_FIELDS))


@functools.lru_cache(maxsize=4)
def _cached_steps(mesh: Mesh, model_config: model_config.TransformerConfig,
                  step_fields: tuple[tuple[str, Any], ...]) -> Steps:
  return Steps(mesh, model_config, ml_collections.ConfigDict(dict(step_fields)))


def evaluate_loss(steps: Steps, state: train_state.TrainState,
                  batches: Iterator[dict[str, np.ndarray]]) -> dict[str, float]:
  """Loss per target token, perplexity and token accuracy over eval batches (global rows)."""
  totals = {"loss_sum": 0.0, "correct": 0.0, "tokens": 0.0}
  for batch in batches:
    sums = jax.device_get(steps.eval(state, steps.global_batch(device_mesh.process_rows(batch))))
    totals = {k: totals[k] + float(sums[k]) for k in totals}
  loss = totals["loss_sum"] / totals["tokens"]
  return {
      "loss": loss, "perplexity": float(np.exp(loss)),
      "accuracy": totals["correct"] / totals["tokens"]
  }


def check_divisible(train_config: ml_collections.ConfigDict) -> None:
  """Batch sizes must split evenly over the devices (and the processes).

  Raises:
    ValueError: naming the field, its value and the device count.
  """
  for field in ("batch_size", "eval_batch_size"):
    value = train_config[field]
    if value % jax.device_count():
      raise ValueError(f"config field train.{field}={value} must be divisible by the number of "
                       f"devices ({jax.device_count()}).")
  micro = train_config.grad_accumulation_steps * jax.device_count()
  if train_config.batch_size % micro:
    raise ValueError(f"config field train.batch_size={train_config.batch_size} must be divisible "
                     f"by train.grad_accumulation_steps={train_config.grad_accumulation_steps} "
                     f"times the number of devices ({jax.device_count()}).")
