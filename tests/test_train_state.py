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


def test_optimizer_clips_then_adam_then_decays_matrices_only():
  """grad_clip_norm and weight_decay: global-norm clipping before Adam, then decoupled weight
  decay of the matrices alone (not biases or LayerNorm scales), then the schedule."""
  config = tiny.get_config().train
  config.update(learning_rate=0.01, warmup_steps=2, adam_b1=0.9, adam_b2=0.98, adam_eps=1e-9,
                grad_clip_norm=0.5, weight_decay=0.1)
  params = {
      "w": jnp.array([[1.0, -2.0], [0.5, 3.0]]), "b": jnp.array([0.1, -0.1]),
      "layer_norm": {"scale": jnp.array([1.5, 0.5]), "bias": jnp.array([0.2, -0.3])}
  }
  schedule = train_state.learning_rate_schedule(config)
  ours = train_state.make_optimizer(config)
  reference = optax.chain(
      optax.clip_by_global_norm(0.5), optax.scale_by_adam(b1=0.9, b2=0.98, eps=1e-9),
      optax.add_decayed_weights(0.1, mask=lambda p: jax.tree.map(lambda x: x.ndim > 1, p)),
      optax.scale_by_learning_rate(schedule))
  unclipped = optax.chain(
      optax.scale_by_adam(b1=0.9, b2=0.98, eps=1e-9),
      optax.add_decayed_weights(0.1, mask=lambda p: jax.tree.map(lambda x: x.ndim > 1, p)),
      optax.scale_by_learning_rate(schedule))
  states = [t.init(params) for t in (ours, reference, unclipped)]
  for i in range(3):
    grads = jax.tree.map(lambda p: (i + 2) * jnp.sin(p * (i + 1)), params)
    assert optax.global_norm(grads) > 1.0  # above the clip's 0.5
    updates = []
    for n, transform in enumerate((ours, reference, unclipped)):
      update, states[n] = transform.update(grads, states[n], params)
      updates.append(update)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), updates[0], updates[1])
  # Adam's first step is the same for any scale of the gradients; its later ones are not.
  assert not np.allclose(updates[0]["w"], updates[2]["w"], rtol=1e-3)
  # Zero gradients make Adam's step 0: what remains is the decay, of the matrix alone.
  update, _ = ours.update(jax.tree.map(jnp.zeros_like, params), ours.init(params), params)
  np.testing.assert_allclose(update["w"], -schedule(0) * 0.1 * params["w"], rtol=1e-6)
  for leaf in (update["b"], update["layer_norm"]["scale"], update["layer_norm"]["bias"]):
    np.testing.assert_array_equal(leaf, 0.0)


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
