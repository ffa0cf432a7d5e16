"""The train state and what updates it: the optimizer, the loss and the float16 loss scale.

The train state is a dict of pure pytrees, the layout checkpoints hold:
  step         int32 []: updates taken (skipped non-finite ones included)
  params       the model's nnx.Param values (nested dict)
  rng          the model's RNG streams (nnx.RngState: dropout key and count)
  opt_state    optax state
  num_skipped  int32 []: updates skipped for a non-finite loss, gradient or update (a float16
               loss-scale overflow, which only lowers the scale, not counted)
  loss_scale   only under model.dtype='float16': {"scale": float32 [], "good_steps": int32 []},
               the dynamic loss scale (see `update_loss_scale`)

Under `model.dtype` bfloat16 or float16 the parameters, optimizer state, logits and loss stay
float32; float16's narrow range needs the loss scaled up before differentiation (gradients of
small activations would flush to zero) and the gradients scaled back down.
"""
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx

from relpos import model as model_lib
from relpos import model_config
from relpos.data import tokenizer as tokenizer_lib

TrainState = dict[str, Any]

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


def applied_updates(opt_state: Any) -> int:
  """The updates applied so far: the count of `learning_rate_schedule` in `opt_state` (of
  `make_optimizer`), which a skipped update leaves as it was, a float16 loss-scale overflow
  included; the next update's learning rate is the schedule at it."""
  is_schedule = lambda node: isinstance(node, optax.ScaleByScheduleState)
  [schedule] = [n for n in jax.tree.leaves(opt_state, is_leaf=is_schedule) if is_schedule(n)]
  return int(schedule.count)


def make_optimizer(train_config: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """Adam (b1, b2, eps of the config), optional global-norm clipping and decoupled weight decay
  (matrices only), scaled by `learning_rate_schedule`."""
  transforms = []
  if train_config.grad_clip_norm > 0:
    transforms.append(optax.clip_by_global_norm(train_config.grad_clip_norm))
  transforms.append(
      optax.scale_by_adam(b1=train_config.adam_b1, b2=train_config.adam_b2,
                          eps=train_config.adam_eps))
  if train_config.weight_decay > 0:
    transforms.append(
        optax.add_decayed_weights(train_config.weight_decay,
                                  mask=lambda params: jax.tree.map(lambda p: p.ndim > 1, params)))
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
INITIAL_LOSS_SCALE = 2.0**15
LOSS_SCALE_PERIOD = 2000


def initial_loss_scale() -> dict[str, jax.Array]:
  return {
      "scale": jnp.asarray(INITIAL_LOSS_SCALE, jnp.float32), "good_steps": jnp.zeros((), jnp.int32)
  }


def update_loss_scale(loss_scale: dict[str, jax.Array],
                      grads_finite: jax.Array) -> dict[str, jax.Array]:
  """The loss scale after an update whose unscaled gradients were finite or not."""
  good_steps = jnp.where(grads_finite, loss_scale["good_steps"] + 1, 0)
  grow = good_steps >= LOSS_SCALE_PERIOD
  scale = jnp.where(grads_finite, jnp.where(grow, loss_scale["scale"] * 2.0, loss_scale["scale"]),
                    jnp.maximum(loss_scale["scale"] / 2.0, 1.0))
  return {"scale": scale, "good_steps": jnp.where(grow, 0, good_steps)}


# --- model and state ---------------------------------------------------------------------------


def init_train_state(model_config: model_config.TransformerConfig,
                     optimizer: optax.GradientTransformation, seed: int | jax.Array) -> TrainState:
  """A fresh train state (see the module docstring for its layout) from an int seed."""
  _, params, rng = model_lib.split_model(model_lib.build_model(model_config, seed))
  state = {
      "step": jnp.zeros((), jnp.int32), "params": params, "rng": rng,
      "opt_state": optimizer.init(params), "num_skipped": jnp.zeros((), jnp.int32)
  }
  if model_config.dtype == "float16":
    state["loss_scale"] = initial_loss_scale()
  return state


def model_from_state(graphdef: nnx.GraphDef, state: TrainState) -> model_lib.Transformer:
  """The model with the parameters and RNG streams of `state`."""
  return nnx.merge(graphdef, state["params"], state["rng"])
