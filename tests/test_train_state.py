"""Tests for relpos.train_state: the learning-rate schedule, optimizer, loss and loss scale."""
import jax
import jax.numpy as jnp
import numpy as np
import optax

from configs import tiny
from relpos import train_state


def test_learning_rate_schedule_warms_up_then_decays():
  config = tiny.get_config().train
  config.update(learning_rate=0.002, warmup_steps=4)
  schedule = train_state.learning_rate_schedule(config)
  rates = [float(schedule(count)) for count in (0, 1, 3, 15, 399)]
  np.testing.assert_allclose(rates, [0.0005, 0.001, 0.002, 0.001, 0.0002], rtol=1e-6)


def test_optimizer_is_adam_with_the_schedule():
  config = tiny.get_config().train
  config.update(learning_rate=0.01, warmup_steps=2, adam_b1=0.9, adam_b2=0.98, adam_eps=1e-9)
  params = {"w": jnp.array([[1.0, -2.0], [0.5, 3.0]]), "b": jnp.array([0.1, -0.1])}
  ours, reference = train_state.make_optimizer(config), optax.adam(
      train_state.learning_rate_schedule(config), b1=0.9, b2=0.98, eps=1e-9)
  ours_state, reference_state = ours.init(params), reference.init(params)
  for i in range(3):
    grads = jax.tree.map(lambda p: jnp.sin(p * (i + 1)), params)
    ours_updates, ours_state = ours.update(grads, ours_state, params)
    reference_updates, reference_state = reference.update(grads, reference_state, params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), ours_updates,
                 reference_updates)


def test_cross_entropy_with_label_smoothing_and_padding():
  logits = jnp.log(jnp.array([[[0.7, 0.1, 0.2], [0.2, 0.2, 0.6], [0.3, 0.3, 0.4]]]))
  targets = jnp.array([[2, 1, 0]])  # the last token is padding
  loss, tokens = train_state.cross_entropy(logits, targets)
  np.testing.assert_allclose(loss, -np.log(0.2) - np.log(0.2), rtol=1e-6)
  assert float(tokens) == 2.0
  smoothed, _ = train_state.cross_entropy(logits, targets, label_smoothing=0.1)
  soft = np.array([[0.05, 0.05, 0.9], [0.05, 0.9, 0.05]])
  probs = np.array([[0.7, 0.1, 0.2], [0.2, 0.2, 0.6]])
  entropy = -(0.9 * np.log(0.9) + 2 * 0.05 * np.log(0.05))
  np.testing.assert_allclose(smoothed, np.sum(-soft * np.log(probs)) - 2 * entropy, rtol=1e-5)


def test_loss_scale_halves_on_overflow_and_doubles_after_a_period():
  scale = train_state.initial_loss_scale()
  halved = train_state.update_loss_scale(scale, jnp.array(False))
  assert float(halved["scale"]) == train_state.INITIAL_LOSS_SCALE / 2 and int(
      halved["good_steps"]) == 0
  almost = {"scale": halved["scale"], "good_steps": jnp.array(train_state.LOSS_SCALE_PERIOD - 2)}
  kept = train_state.update_loss_scale(almost, jnp.array(True))
  assert float(kept["scale"]) == float(halved["scale"])
  doubled = train_state.update_loss_scale(kept, jnp.array(True))
  assert float(doubled["scale"]) == train_state.INITIAL_LOSS_SCALE and int(
      doubled["good_steps"]) == 0
  floor = train_state.update_loss_scale({"scale": jnp.array(1.0), "good_steps": jnp.array(0)},
                                        jnp.array(False))
  assert float(floor["scale"]) == 1.0
