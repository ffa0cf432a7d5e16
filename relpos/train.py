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
from typing import Any

import grain
import jax
import ml_collections
import orbax.checkpoint as ocp
import tqdm
from absl import logging

from relpos import checkpoints
from relpos import device_mesh
from relpos import evaluate
from relpos import locks
from relpos import metrics_writer
from relpos import recorder
from relpos import run_config
from relpos import source_tree
from relpos import steps as steps_lib
from relpos import train_state
from relpos.data import pipeline
from relpos.preemption import Preemption


def _is_multiple(step: int, every: int, last: int) -> bool:
  return step % every == 0 or step == last


def _validate(config: run_config.RunConfig, task: pipeline.Task, steps: steps_lib.Steps,
              state: train_state.TrainState) -> dict[str, Any]:
  """Validation loss and accuracy, and beam-search BLEU / chrF when `decode.validation_bleu`."""
  results = steps_lib.evaluate_loss(
      steps, state, task.eval_batches(recorder.VALIDATION_SPLIT, config.train.eval_batch_size))
  if config.decode.validation_bleu:
    scores = evaluate.score_split(train_state.model_from_state(steps.graphdef, state), task,
                                  recorder.VALIDATION_SPLIT, config, mesh=steps.mesh)
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
    recorder.NonFiniteError: a non-finite loss, gradient or updated parameters with
      `train.nonfinite='raise'`; with 'skip', more than `train.max_skipped_fraction` of the
      steps skipped.
  """
  started = time.perf_counter()
  if not isinstance(config, run_config.RunConfig):
    config = run_config.validate(config)
  steps = steps_lib.get_steps(device_mesh.make_mesh(), config.model, config.train)
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise ValueError(f"workdir {workdir} exists and is not a folder.")
  os.makedirs(workdir, exist_ok=True)
  with locks.hold(workdir):
    manager = checkpoints.make_manager(workdir, keep=config.train.keep_checkpoints)
    try:
      metrics_writer.read_metrics(workdir)  # a damaged metrics.jsonl stops before any write
      run_config.check_resume(config, workdir, resuming=manager.latest_step() is not None)
      task = pipeline.get_task(config.task)
      train_iterator = task.train_iterator(config.train.batch_size, seed=config.seed,
                                           shard_index=jax.process_index(),
                                           shard_count=jax.process_count())
      state = _initial_state(config, steps, manager, train_iterator)
      run_config.write_to(config, workdir)  # once the checkpoints are known to fit the config
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
  progress = tqdm.tqdm(total=last, initial=first, unit="step", dynamic_ncols=True,
                       disable=jax.process_index() != 0)
  records = recorder.Recorder(workdir, train_config, first, int(state["num_skipped"]), progress,
                              manager.latest_step, started)
  result = {
      "step": first, "preempted": False, "early_stopped": False,
      "train": records.last.get("train", {}),
      "validation": records.last.get(recorder.VALIDATION_SPLIT, {}), "validation_time_s": 0.0
  }
  with (progress, Preemption() as
        preemption, metrics_writer.MetricsWriter(workdir, resume_step=first) as writer):
    for step in range(first + 1, last + 1):
      state, metrics = steps.train(state, steps.global_batch(next(train_iterator)))
      records.push(step, metrics)
      preempted = preemption.reached(step)
      evaluate_now = _is_multiple(step, train_config.eval_every_steps, last)
      save_now = (evaluate_now or preempted or
                  _is_multiple(step, train_config.checkpoint_every_steps, last))
      if save_now or step % train_config.log_every_steps == 0:
        result["train"] = records.train_summary(step, int(state["num_skipped"]))
        writer.write(step, "train", result["train"])
      eval_metrics = None
      if evaluate_now:
        start = time.perf_counter()
        eval_metrics = result["validation"] = {
            **_validate(config, task, steps, state), "time_s": time.perf_counter() - start
        }
        result["validation_time_s"] += eval_metrics["time_s"]
        writer.write(step, recorder.VALIDATION_SPLIT, eval_metrics)
        records.add_validation(eval_metrics)
      if save_now:
        ranking = recorder.checkpoint_metrics(eval_metrics)
        checkpoints.save(manager, state, train_iterator, metrics=ranking)
      if evaluate_now or save_now:
        records.restart_clock()
      result["step"] = step
      patience = train_config.early_stopping_patience
      if (evaluate_now and patience and
          recorder.evaluations_since_best(records.validation) >= patience):
        logging.warning("Early stop at step %d: %d evaluations without a better validation %s.",
                        step, patience, "BLEU" if "bleu" in eval_metrics else "loss")
        result["early_stopped"] = True
        break
      if preempted:
        logging.warning("Preempted: saved step %d to %s.", step, manager.directory)
        result["preempted"] = True
        break
    records.flush()
  checkpoints.wait(manager)
  if preemption.signal == "SIGINT":
    raise KeyboardInterrupt(f"saved step {result['step']} to {manager.directory}; run the same "
                            "command again to resume.")
  return result
