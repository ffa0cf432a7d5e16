"""Training: schedule, optimizer, loss, data parallelism, and tiny end-to-end runs."""
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh

from configs import tiny
from relpos import checkpoints
from relpos import device_mesh
from relpos import run_config
from relpos import evaluate
from relpos import metrics_writer
from relpos import steps as steps_lib
from relpos import train
from relpos import train_state

NUM_STEPS = 12


def tiny_config(data_dir: str, **train_overrides):
  """configs/tiny.py with its data under `data_dir`."""
  config = tiny.get_config()
  config.task.tfds_data_dir = data_dir
  config.train.update(train_overrides)
  return config


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return str(tmp_path_factory.getbasetemp() / "relpos_data")


@pytest.fixture(scope="module")
def trained(data_dir, tmp_path_factory):
  """(config, workdir, result) of an uninterrupted tiny run of NUM_STEPS steps."""
  config = tiny_config(data_dir, num_steps=NUM_STEPS)
  workdir = str(tmp_path_factory.mktemp("trained"))
  return config, workdir, train.train_and_evaluate(config, workdir)


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


def test_run_writes_config_metrics_events_and_checkpoints(trained):
  config, workdir, result = trained
  with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
    assert json.load(f) == run_config.validate(config).to_dict()
  records = metrics_writer.read_metrics(workdir)
  train_steps = [r["step"] for r in records if r["split"] == "train"]
  assert train_steps == [2, 4, 6, 8, 10, 12]
  validation = [r for r in records if r["split"] == "validation"]
  assert [r["step"] for r in validation] == [6, 12]
  for record in validation:
    assert record["num_sentences"] == config.task.synthetic.num_validation
    assert 0.0 <= record["accuracy"] <= 1.0 and record["loss"] > 0
    assert record["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
  assert result["step"] == NUM_STEPS and not result["preempted"]
  assert result["validation"] == {
      k: v for k, v in validation[-1].items() if k not in ("step", "split")
  }
  assert all(record["time_s"] > 0 for record in validation)
  assert result["validation_time_s"] == pytest.approx(sum(r["time_s"] for r in validation))
  train_losses = [r["smoothed_loss"] for r in records if r["split"] == "train"]
  assert train_losses[-1] < train_losses[0]
  assert os.listdir(os.path.join(workdir, "tensorboard"))
  manager = checkpoints.make_manager(workdir, read_only=True)
  # The last 2 (8, 12); the best is kept besides (test_early_stopping_after_patience_evaluations:
  # 12 steps translate every sentence empty, BLEU 0.0 at 6 and 12, a tie).
  assert set(manager.all_steps()) - {6} == {8, 12}
  state = checkpoints.read_state(workdir)
  assert int(state["step"]) == NUM_STEPS and int(state["num_skipped"]) == 0


def test_restarted_run_continues_from_its_checkpoint(trained, tmp_path):
  config, workdir, _ = trained
  stopped = str(tmp_path)
  first = train.train_and_evaluate(tiny_config(config.task.tfds_data_dir, num_steps=8), stopped)
  assert first["step"] == 8
  second = train.train_and_evaluate(config, stopped)
  assert second["step"] == NUM_STEPS
  records = metrics_writer.read_metrics(stopped)
  # Steps 1-8 ran once: the restart began at 8, not 0.
  assert [r["step"] for r in records if r["split"] == "train"] == [2, 4, 6, 8, 10, 12]
  expected, resumed = checkpoints.read_state(workdir), checkpoints.read_state(stopped)
  jax.tree.map(np.testing.assert_array_equal, resumed, expected)
  uninterrupted = [r for r in metrics_writer.read_metrics(workdir) if r["split"] == "train"]
  assert metrics_writer.without_timing(uninterrupted) == metrics_writer.without_timing(
      [r for r in records if r["split"] == "train"])


def test_invalid_config_stops_before_any_work(data_dir, tmp_path):
  workdir = str(tmp_path / "run")
  config = tiny_config(data_dir)
  config.train.nonfinite = "ignore"
  with pytest.raises(
      ValueError, match="config field train.nonfinite='ignore' is invalid: must "
      "be one of 'raise', 'skip'"):
    train.train_and_evaluate(config, workdir)
  config = tiny_config(data_dir, batch_size=6)
  with pytest.raises(
      ValueError, match=r"train.batch_size=6 must be divisible by the number of "
      r"devices \(4\)"):
    train.train_and_evaluate(config, workdir)
  assert not os.path.exists(workdir)
  (tmp_path / "file").write_text("")
  with pytest.raises(ValueError, match=f"workdir {tmp_path}/file exists and is not a folder"):
    train.train_and_evaluate(tiny_config(data_dir), str(tmp_path / "file"))


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


def test_accumulation_must_divide_the_batch(data_dir, tmp_path):
  config = tiny_config(data_dir, grad_accumulation_steps=3)
  with pytest.raises(
      ValueError, match=r"train\.batch_size=8 must be divisible by "
      r"train\.grad_accumulation_steps=3"):
    train.train_and_evaluate(config, str(tmp_path))


def test_early_stopping_after_patience_evaluations(data_dir, tmp_path, monkeypatch):
  losses = iter([3.0, 2.0, 2.5, 2.4, 1.0])
  monkeypatch.setattr(train, "_validate", lambda *args: {"loss": next(losses)})
  config = tiny_config(data_dir, num_steps=10, eval_every_steps=2, checkpoint_every_steps=2,
                       early_stopping_patience=2)
  result = train.train_and_evaluate(config, str(tmp_path))
  assert result["early_stopped"] and result["step"] == 8
  manager = checkpoints.make_manager(str(tmp_path), read_only=True)
  # The last 2 and the best (the lowest loss, at step 4), which evaluation's "best" restores.
  assert (manager.latest_step(), manager.best_step(), manager.all_steps()) == (8, 4, [4, 6, 8])
  validated = run_config.validate(config)
  assert evaluate.restore_model(str(tmp_path), validated, "best", device_mesh.make_mesh())[1] == 4


def test_config_written_before_the_new_train_fields_still_validates():
  config = tiny.get_config()
  del config.train["grad_accumulation_steps"], config.train["early_stopping_patience"]
  validated = run_config.validate(config)
  assert (validated.train.grad_accumulation_steps, validated.train.early_stopping_patience) == (1,
                                                                                                0)
  assert "grad_accumulation_steps" not in config.train  # what it was given is left as it is


def _saved_run(tmp_path, edit=lambda saved: None) -> tuple[str, dict]:
  """A workdir holding the tiny config's config.json after `edit(saved dict)`."""
  saved = run_config.validate(tiny.get_config()).to_dict()
  edit(saved)
  with open(tmp_path / "config.json", "w", encoding="utf-8") as f:
    json.dump(saved, f)
  return str(tmp_path), saved


@pytest.mark.parametrize("field, value", [("model.position", "rope"), ("model.dtype", "bfloat16"),
                                          ("model.dropout_rate", 0.3),
                                          ("model.max_relative_position", 8)])
def test_a_model_field_changed_on_resume_stops(tmp_path, field, value):
  workdir, saved = _saved_run(tmp_path)
  config = tiny.get_config()
  if field == "model.position":  # the other variant's fields at their defaults
    config.model.max_relative_position = 16
  config.model[field.split(".")[1]] = value
  config = run_config.validate(config)
  run_config.check_resume(config, workdir, resuming=False)  # nothing saved: a warning
  before = saved["model"][field.split(".")[1]]
  with pytest.raises(
      ValueError, match=(
          rf"^config field {field}={value!r} differs from the {before!r} that the checkpoints in "
          rf"{workdir} were trained with \({workdir}/config.json\): the model would change under "
          rf"its parameters. Resume with {field}={before!r} or train in a new --workdir.$")):
    run_config.check_resume(config, workdir, resuming=True)


def test_resume_allows_the_kernel_and_training_dynamics_to_change(tmp_path, caplog):
  workdir, _ = _saved_run(tmp_path)
  config = tiny.get_config()
  config.model.attention_implementation = "xla"
  config.train.update(learning_rate=0.001, num_steps=40)
  run_config.check_resume(run_config.validate(config), workdir, resuming=True)
  assert "model.attention_implementation='auto'->'xla'" in caplog.text
  assert "train.learning_rate=0.002->0.001" in caplog.text


def test_a_field_newer_than_the_saved_config_stops_a_resume_only_off_its_default(tmp_path, caplog):
  """A campaign resumed across commits: a field the old config.json lacks was its default."""
  workdir, _ = _saved_run(tmp_path,
                          lambda saved: saved["model"].pop("relative_shared_across_layers"))
  config = tiny.get_config()
  run_config.check_resume(run_config.validate(config), workdir, resuming=True)
  assert "changed since the run's last start" not in caplog.text
  config.model.relative_shared_across_layers = True
  with pytest.raises(ValueError, match=r"model.relative_shared_across_layers=True differs from "
                     r"the False "):
    run_config.check_resume(run_config.validate(config), workdir, resuming=True)


def test_a_damaged_metrics_line_stops_a_resume_naming_it_before_any_write(trained, tmp_path):
  config, workdir, _ = trained
  resumed = str(tmp_path / "run")
  shutil.copytree(workdir, resumed)
  path = os.path.join(resumed, "metrics.jsonl")
  with open(path, encoding="utf-8") as f:
    lines = f.readlines()
  lines[2] = lines[2].replace('"train"', '"tr\x01ain"')  # a byte a failing disk flipped
  with open(path, "w", encoding="utf-8") as f:
    f.writelines(lines)
  config_json = os.path.join(resumed, "config.json")
  os.utime(config_json, (0, 0))
  with pytest.raises(
      ValueError,
      match=(rf"^{path}:3 is not a JSON record \(Invalid control character at: line 1 column \d+ "
             r"\(char \d+\)\): repair or delete that line \(the checkpoints do not need it\)\.$")):
    train.train_and_evaluate(tiny_config(config.task.tfds_data_dir, num_steps=16), resumed)
  assert os.path.getmtime(config_json) == 0


def test_a_checkpoints_file_stops_training_and_evaluation_before_any_step(data_dir, tmp_path):
  workdir = str(tmp_path)
  (tmp_path / "checkpoints").write_text("", encoding="utf-8")
  message = (rf"^{workdir}/checkpoints is a file, not a folder of checkpoints: move it aside or "
             r"pass another --workdir\.$")
  with pytest.raises(ValueError, match=message):
    train.train_and_evaluate(tiny_config(data_dir), workdir)
  assert sorted(os.listdir(workdir)) == ["checkpoints", "train.lock"]
  run_config.write_to(run_config.validate(tiny_config(data_dir)), workdir)
  with pytest.raises(ValueError, match=message):
    evaluate.evaluate_checkpoint(workdir, split="validation")
