"""Training: the loop that trains, validates, checkpoints and resumes a run.

`train_and_evaluate(config, workdir)` validates the config, restores the latest checkpoint of
`workdir` when there is one (exact resume: parameters, optimizer state, step, dropout RNG and
the data iterator position), trains with periodic evaluation (loss, token accuracy and, with
`decode.validation_bleu`, beam-search sacreBLEU through `relpos.evaluate`, the code eval.py
runs), writes `config.json`, `metrics.jsonl` and TensorBoard events, and saves Orbax
checkpoints (`relpos.checkpoints`). On SIGTERM it saves and returns (`preempted: True`); on
SIGINT (Ctrl-C) it saves and raises KeyboardInterrupt.

The train state and its optimizer are `relpos.train_state`'s; the compiled steps
`relpos.steps`'.
"""
import os
import time
from collections.abc import Callable
from typing import Any

import grain
import jax
import ml_collections
import optax
import orbax.checkpoint as ocp
import tqdm
from absl import logging

from relpos import checkpoints
from relpos import device_mesh
from relpos import evaluate
from relpos import locks
from relpos import metrics_writer
from relpos import run_config
from relpos import source_tree
from relpos import steps as steps_lib
from relpos import train_state
from relpos import user_modules
from relpos import variants
from relpos.data import pipeline
from relpos.preemption import Preemption

VALIDATION_SPLIT = "validation"


class NonFiniteError(FloatingPointError):
  """A non-finite loss, gradient or updated parameters with `train.nonfinite='raise'`, or too
  many skipped updates with 'skip'."""


# --- the loop ----------------------------------------------------------------------------------


class _Recorder:
  """Host side of the train metrics: checks finiteness, averages over a log interval.

  Step t's metrics are read after step t + 1 is dispatched, so the host never stalls the
  device except at log, eval and checkpoint steps.
  """
  def __init__(self, train_config: ml_collections.ConfigDict, num_skipped: int, progress: tqdm.tqdm,
               last_checkpoint: Callable[[], Any]):
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
    summary = {
        "smoothed_loss": means["loss"], "grad_norm": means["grad_norm"],
        "steps_per_second": self._steps_timed / elapsed if self._steps_timed else None
    }
    self._sums = {k: 0.0 for k in self._sums}
    self._count = 0
    if self._start is not None:
      self.restart_clock()
    return summary


def _is_multiple(step: int, every: int, last: int) -> bool:
  return step % every == 0 or step == last


def _validate(config: run_config.RunConfig, task: pipeline.Task, steps: steps_lib.Steps,
              state: train_state.TrainState) -> dict[str, Any]:
  """Validation loss and accuracy, and beam-search BLEU / chrF when `decode.validation_bleu`."""
  results = steps_lib.evaluate_loss(
      steps, state, task.eval_batches(VALIDATION_SPLIT, config.train.eval_batch_size))
  if config.decode.validation_bleu:
    scores = evaluate.score_split(train_state.model_from_state(steps.graphdef, state), task,
                                  VALIDATION_SPLIT, config, mesh=steps.mesh)
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
      trial: `variant_trial.check_variant`), a workdir that is a file, checkpoints of another
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
  steps_lib.check_divisible(config)
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise ValueError(f"workdir {workdir} exists and is not a folder.")
  os.makedirs(workdir, exist_ok=True)
  with locks.hold(workdir):
    manager = checkpoints.make_manager(workdir, keep=config.train.keep_checkpoints)
    try:
      run_config.check_resume(config, workdir, resuming=manager.latest_step() is not None)
      task = pipeline.get_task(config.task)
      steps = steps_lib.get_steps(device_mesh.make_mesh(), config.model, config.train)
      train_iterator = task.train_iterator(config.train.batch_size, seed=config.seed,
                                           shard_index=jax.process_index(),
                                           shard_count=jax.process_count())
      state = _initial_state(config, steps, manager, train_iterator)
      metrics_writer.read_metrics(workdir)  # a damaged metrics.jsonl stops before any write
      run_config.write_to(config, workdir)
      user_modules.write_imports(workdir, variants.get(config.model.position).__module__)
      metrics_writer.record_start(workdir, int(state["step"]), source_tree.commit())
      return _train_loop(config, workdir, task, steps, state, manager, train_iterator, started)
    finally:
      manager.close()


def _initial_state(config: run_config.RunConfig, steps: steps_lib.Steps,
                   manager: ocp.CheckpointManager,
                   train_iterator: grain.DatasetIterator) -> train_state.TrainState:
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
  return [
      record for record in metrics_writer.read_metrics(workdir)
      if record["split"] == VALIDATION_SPLIT and record["step"] <= up_to_step
  ]


def _last_records(workdir: str) -> dict[str, dict[str, Any]]:
  """Split -> the metrics of its last record in metrics.jsonl (without step and split)."""
  last = {}
  for record in metrics_writer.read_metrics(workdir):
    last[record["split"]] = {k: v for k, v in record.items() if k not in ("step", "split")}
  return last


def _train_summary(recorder: _Recorder, state: train_state.TrainState, schedule: optax.Schedule,
                   elapsed_s: float) -> dict[str, float]:
  """Means since the last summary, skipped updates so far, the next update's rate and the
  run's seconds so far (`metrics_writer.elapsed_seconds`)."""
  num_skipped = int(state["num_skipped"])
  return {
      **recorder.summary(), "skipped_updates": num_skipped,
      "learning_rate": float(schedule(int(state["step"]) - num_skipped)), "elapsed_s": elapsed_s
  }


def _train_loop(config: run_config.RunConfig, workdir: str, task: pipeline.Task,
                steps: steps_lib.Steps, state: train_state.TrainState,
                manager: ocp.CheckpointManager, train_iterator: grain.DatasetIterator,
                started: float) -> dict[str, Any]:
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
  schedule = train_state.learning_rate_schedule(train_config)
  last_records = _last_records(workdir)
  validation_history = _validation_history(workdir, first)
  earlier_s = metrics_writer.elapsed_seconds(
      [r for r in metrics_writer.read_metrics(workdir) if r["step"] <= first])
  result = {
      "step": first, "preempted": False, "early_stopped": False,
      "train": last_records.get("train", {}), "validation": last_records.get(VALIDATION_SPLIT, {}),
      "validation_time_s": 0.0
  }
  progress = tqdm.tqdm(total=last, initial=first, unit="step", dynamic_ncols=True,
                       disable=jax.process_index() != 0)
  recorder = _Recorder(train_config, int(state["num_skipped"]), progress, manager.latest_step)
  with (progress, Preemption() as
        preemption, metrics_writer.MetricsWriter(workdir, resume_step=first) as writer):
    for step in range(first + 1, last + 1):
      state, metrics = steps.train(state, steps.global_batch(next(train_iterator)))
      recorder.push(step, metrics)
      preempted = preemption.reached(step)
      evaluate_now = _is_multiple(step, train_config.eval_every_steps, last)
      save_now = (evaluate_now or preempted or
                  _is_multiple(step, train_config.checkpoint_every_steps, last))
      if save_now or step % train_config.log_every_steps == 0:
        result["train"] = _train_summary(recorder, state, schedule,
                                         earlier_s + time.perf_counter() - started)
        writer.write(step, "train", result["train"])
      eval_metrics = None
      if evaluate_now:
        start = time.perf_counter()
        eval_metrics = result["validation"] = {
            **_validate(config, task, steps, state), "time_s": time.perf_counter() - start
        }
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
