"""Tests for relpos.steps: data-parallel train steps, half precision, gradient accumulation."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh

from configs import tiny
from relpos import run_config
from relpos import steps as steps_lib
from relpos import train_state


def _random_batch(rng: np.random.Generator, rows: int, length: int, vocab: int):
  lengths = rng.integers(2, length, size=(rows, 2))
  batch = {}
  for column, name in enumerate(("inputs", "targets")):
    on = np.arange(length)[None] < lengths[:, column:column + 1]
    batch[name] = np.where(on, rng.integers(3, vocab, size=(rows, length)), 0).astype(np.int32)
    batch[name][np.arange(rows), lengths[:, column] - 1] = 1  # eos
    batch[f"{name}_position"] = np.where(on, np.arange(length)[None], 0).astype(np.int32)
    batch[f"{name}_segmentation"] = on.astype(np.int32)
  return batch


def test_one_step_is_the_same_on_one_and_four_devices():
  assert jax.device_count() == 4
  config = tiny.get_config()
  model_config = run_config.validate(config).model
  batch = _random_batch(np.random.default_rng(0), 8, 16, config.task.vocab_size)
  initial = None
  outputs = []
  for devices in (jax.devices()[:1], jax.devices()):
    steps = steps_lib.get_steps(Mesh(np.asarray(devices), ("data",)), model_config, config.train)
    initial = steps.init(0) if initial is None else initial
    state, metrics = steps.train(jax.device_put(initial, steps.replicated, may_alias=False),
                                 steps.global_batch(batch))
    outputs.append((jax.device_get(state["params"]), jax.device_get(metrics)))
  (params_1, metrics_1), (params_4, metrics_4) = outputs
  np.testing.assert_allclose(metrics_1["loss"], metrics_4["loss"], rtol=1e-6)
  np.testing.assert_allclose(metrics_1["grad_norm"], metrics_4["grad_norm"], rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), params_1,
               params_4)


def updates_on_one_batch(config, batch, count: int) -> tuple[list[float], dict]:
  """(the loss of each of `count` updates on `batch`, the final state on the host), from seed 0
  on one device."""
  mesh = Mesh(np.asarray(jax.devices()[:1]), ("data",))
  steps = steps_lib.get_steps(mesh, run_config.validate(config).model, config.train)
  state, losses = steps.init(0), []
  for _ in range(count):
    state, metrics = steps.train(state, steps.global_batch(batch))
    losses.append(float(metrics["loss"]))
  return losses, jax.device_get(state)


# The largest relative loss gap to float32 over HALF_PRECISION_STEPS updates, measured
# (bfloat16 3.9e-4, float16 7.1e-5), times about 2.5; and the relative gap of the updates (final
# minus initial parameters, global norm of the difference over that of float32's), measured
# (bfloat16 0.057, float16 0.0076), times about 2.5.
HALF_PRECISION_STEPS = 5

LOSS_RTOL = {"bfloat16": 1e-3, "float16": 2e-4}

UPDATE_RTOL = {"bfloat16": 0.15, "float16": 0.02}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_train_steps_stay_close_to_float32(dtype):
  """Five updates on one batch: the losses and the updates (final minus initial parameters,
  float32 in both) close to the float32 run's, relative to their size; the optimizer state
  stays float32 (float16: under a loss scale)."""
  config = tiny.get_config()
  batch = _random_batch(np.random.default_rng(1), 8, 16, config.task.vocab_size)
  runs = {}
  for run_dtype in ("float32", dtype):
    config.model.dtype = run_dtype
    runs[run_dtype] = updates_on_one_batch(config, batch, HALF_PRECISION_STEPS)
  (losses_32, state_32), (losses_16, state_16) = runs["float32"], runs[dtype]
  assert ("loss_scale" in state_16) == (dtype == "float16")
  assert int(state_16["num_skipped"]) == 0
  assert losses_32[-1] < losses_32[0]  # it learns
  loss_gap = np.max(np.abs(np.array(losses_16) / np.array(losses_32) - 1))
  assert {
      leaf.dtype
      for leaf in jax.tree.leaves(state_16["opt_state"])
      if jnp.issubdtype(leaf.dtype, jnp.floating)
  } == {np.dtype(np.float32)}
  initial = initial_params(config)
  update = lambda state: jax.tree.map(np.subtract, state["params"], initial)
  update_32, update_16 = update(state_32), update(state_16)
  update_gap = float(
      optax.global_norm(jax.tree.map(np.subtract, update_16, update_32)) /
      optax.global_norm(update_32))
  assert loss_gap <= LOSS_RTOL[dtype]
  assert update_gap <= UPDATE_RTOL[dtype]


def initial_params(config) -> dict:
  """The parameters `updates_on_one_batch` starts from, on the host."""
  mesh = Mesh(np.asarray(jax.devices()[:1]), ("data",))
  return jax.device_get(
      steps_lib.get_steps(mesh,
                          run_config.validate(config).model, config.train).init(0)["params"])


def test_accumulated_gradient_equals_the_whole_batch_on_four_devices():
  """Two micro-batches give the update of the whole batch (dropout off: same randomness)."""
  config = tiny.get_config()
  config.model.dropout_rate = 0.0
  batch = _random_batch(np.random.default_rng(2), 16, 16, config.task.vocab_size)
  mesh = Mesh(np.asarray(jax.devices()), ("data",))
  outputs = {}
  for accumulation in (1, 2):
    config.train.grad_accumulation_steps = accumulation
    steps = steps_lib.get_steps(mesh, run_config.validate(config).model, config.train)
    state, metrics = steps.train(steps.init(0), steps.global_batch(batch))
    outputs[accumulation] = jax.device_get((state["params"], metrics))
  (params_1, metrics_1), (params_2, metrics_2) = outputs[1], outputs[2]
  np.testing.assert_allclose(metrics_2["loss"], metrics_1["loss"], rtol=1e-6)
  np.testing.assert_allclose(metrics_2["grad_norm"], metrics_1["grad_norm"], rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), params_2,
               params_1)


def test_micro_batches_keep_each_devices_rows():
  rows = np.arange(8)[:, None] * np.ones((1, 3), np.int32)
  split = np.asarray(steps_lib.micro_batches({"inputs": jnp.asarray(rows)}, 2)["inputs"])[..., 0]
  np.testing.assert_array_equal(split, [[0, 2, 4, 6], [1, 3, 5, 7]])


def test_a_non_finite_float16_gradient_counts_once_the_loss_scale_is_at_its_floor():
  """Above the floor an overflow only lowers the scale; at 1, nothing is scaled, so the
  gradient is the model's own and the step counts as non-finite (else float16 training would
  skip every later step without a word)."""
  inf, one = jnp.array(jnp.inf), jnp.array(1.0)
  is_finite = lambda grad_norm, param_norm, scale, loss=one: bool(
      steps_lib.update_is_finite(loss, grad_norm, param_norm, scale))
  assert is_finite(inf, inf, jnp.array(2.0**15))  # an overflow
  assert not is_finite(inf, inf, jnp.array(1.0))
  assert not is_finite(one, inf, jnp.array(2.0**15))  # the update itself blew up
  assert not is_finite(inf, inf, jnp.array(2.0**15), loss=inf)
  assert is_finite(one, one, None) and not is_finite(inf, inf, None)


def test_a_float16_overflow_halves_the_scale_and_is_not_counted_as_skipped():
  """The recorder counts skips that train.nonfinite rules on; the state's count agrees, so a
  resumed float16 run reaches max_skipped_fraction where an uninterrupted one would."""
  config = tiny.get_config()
  config.model.dtype = "float16"
  batch = _random_batch(np.random.default_rng(1), 8, 16, config.task.vocab_size)
  mesh = Mesh(np.asarray(jax.devices()[:1]), ("data",))
  steps = steps_lib.get_steps(mesh, run_config.validate(config).model, config.train)
  state = steps.init(0)
  state["loss_scale"]["scale"] = jnp.asarray(2.0**100, jnp.float32)  # overflows float16
  before = jax.device_get(state["params"])
  state, metrics = steps.train(state, steps.global_batch(batch))
  assert not np.isfinite(float(metrics["grad_norm"])) and float(metrics["finite"]) == 1.0
  assert int(state["num_skipped"]) == 0 and float(state["loss_scale"]["scale"]) == 2.0**99
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(state["params"]), before)
  # Nothing applied: the next update's learning rate is still the first one's.
  assert train_state.applied_updates(state["opt_state"]) == 0
  state["loss_scale"]["scale"] = jnp.asarray(1.0, jnp.float32)
  state, _ = steps.train(state, steps.global_batch(batch))
  assert train_state.applied_updates(state["opt_state"]) == 1
