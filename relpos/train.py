"""Training: the loop that trains, validates, checkpoints and resumes a run.

`train_and_evaluate(config, workdir)` validates the config, restores the latest checkpoint of
`workdir` when there is one (exact resume: parameters, optimizer state, step, dropout RNG and
the data iterator position), trains with periodic evaluation (loss, token accuracy and, with
`decode.validation_bleu`, beam-search sacreBLEU through `relpos.evaluate`, the code eval.py
runs), writes `config.json`, `metrics.jsonl` and TensorBoard events, and saves Orbax
checkpoints (`relpos.checkpoints`). On SIGTERM it saves and returns (`preempted: True`); on
SIGINT (Ctrl-C) it saves and raises KeyboardInterrupt.

The train state and its optimizer are `relpos.train_state`'s; the compiled steps
`relpos.steps`'. The pieces of the loop (`open_workdir`, `recording`, `end_step`) are shared with
`relpos.seed_stack`, which trains several seeds of a config as one program.
"""
import contextlib
import dataclasses
import functools
import os
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

import grain
import jax
import ml_collections
import orbax.checkpoint as ocp
import tqdm
from absl import logging

from relpos import config_changes
from relpos import checkpoint_schedule
from relpos import checkpoints
from relpos import device_mesh
from relpos import evaluate
from relpos import locks
from relpos import metrics_writer
from relpos import recorder
from relpos import run_config
from relpos import source_tree
from relpos import user_modules
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
      steps, state,
      task.eval_batches(recorder.VALIDATION_SPLIT, config.train.eval_batch_size,
                        max_len=config.model.max_len))
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
      trial: `variant_trial.check_variant`), a workdir that is a file, a resume with a field
      its checkpoints cannot take (another architecture, tokenizer, checkpoint ranking,
      optimizer form or data order: `config_changes.check_resume`), or checkpoints written by
      another number of processes.
    checkpoint_damage.DamagedCheckpointError: every checkpoint in `workdir` is damaged.
    locks.WorkdirInUseError: another process trains in `workdir`.
    recorder.NonFiniteError: a non-finite loss, gradient or updated parameters with
      `train.nonfinite='raise'`; with 'skip', more than `train.max_skipped_fraction` of the
      steps skipped.
  """
  started = time.perf_counter()
  if not isinstance(config, run_config.RunConfig):
    config = run_config.validate(config)
  steps = steps_lib.get_steps(device_mesh.make_mesh(), config.model, config.train)
  with open_workdir(config, workdir, steps) as opened:
    user_modules.warn_of_edited_variant(metrics_writer.read_starts(workdir), config.model.position,
                                        "resuming with the file as it is")
    metrics_writer.record_start(workdir, int(opened.state["step"]), source_tree.commit(),
                                user_modules.variant_code(config.model.position),
                                tokenizer_sha256=opened.task.tokenizer.sha256(),
                                config_changes=opened.config_changes,
                                train_examples=dataclasses.asdict(opened.task.train_examples()[1]))
    return _train_loop(config, workdir, steps, opened, started)


class Opened(NamedTuple):
  """A run's workdir opened for training (`open_workdir`)."""
  task: pipeline.Task
  manager: ocp.CheckpointManager
  train_iterator: grain.DatasetIterator  # at the position of `state`
  state: train_state.TrainState  # restored from the newest checkpoint, or fresh
  # (field, value before, value now) of the fields changed since the run's last start.
  config_changes: tuple[metrics_writer.ConfigChange, ...] = ()


@contextlib.contextmanager
def open_workdir(config: run_config.RunConfig, workdir: str,
                 steps: steps_lib.Steps) -> Iterator[Opened]:
  """Locks `workdir` (created when missing), checks and writes its config, opens its checkpoint
  manager and restores its newest state and data position (`initial_state`), for the block.

  Raises:
    ValueError, checkpoint_damage.DamagedCheckpointError, locks.WorkdirInUseError: as
      `train_and_evaluate`.
  """
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise ValueError(f"workdir {workdir} exists and is not a folder.")
  os.makedirs(workdir, exist_ok=True)
  with locks.hold(workdir):
    metrics_writer.read_metrics(workdir)  # a damaged metrics.jsonl stops before any write
    checkpoints.set_aside_damaged_metrics(workdir)  # no manager opens with one
    resuming = checkpoints.newest_step(workdir) is not None
    changes = config_changes.check_resume(config, workdir, resuming=resuming)
    task = pipeline.get_task(config.task)
    if resuming:  # a start that saved no checkpoint trained nothing on its tokenizer
      metrics_writer.check_tokenizer(workdir, task.tokenizer.sha256(), task.tokenizer.path)
    # Opened once the config and the data are known good: a mistake there leaves no
    # checkpoints/ folder, and no Orbax thread to report its own shutdown after the error.
    manager = checkpoints.make_manager(
        workdir, keep=config.train.keep_checkpoints,
        scheduled=functools.partial(checkpoint_schedule.on_schedule, train_config=config.train))
    train_iterator = None
    try:
      train_iterator = task.train_iterator(config.train.batch_size, seed=config.seed,
                                           shard_index=jax.process_index(),
                                           shard_count=jax.process_count())
      state = initial_state(config, steps, manager, train_iterator)
      run_config.write_to(config, workdir)  # once the checkpoints are known to fit the config
      yield Opened(task, manager, train_iterator, state, tuple(changes))
    finally:
      try:
        manager.close()
      finally:  # its prefetch thread, running at exit after an error, aborts Python (134)
        if train_iterator is not None:
          train_iterator.close()


def initial_state(config: run_config.RunConfig, steps: steps_lib.Steps,
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
  if step > config.train.num_steps:  # nothing to train, and its result would not be that run's
    raise ValueError(f"{manager.directory} holds step {step}, past train.num_steps="
                     f"{config.train.num_steps}: resume with train.num_steps >= {step}, or "
                     "train in a new --workdir.")
  logging.warning("Resuming from step %d (%s).", step, manager.directory)
  return state


def progress_bar(first: int, last: int, **kwargs) -> tqdm.tqdm:
  """The progress bar of steps `first` (done) to `last` (process 0 only)."""
  return tqdm.tqdm(total=last, initial=first, unit="step", dynamic_ncols=True,
                   disable=jax.process_index() != 0, **kwargs)


@dataclasses.dataclass
class Run:
  """The host side of one run in a train loop: where it records and its result so far.

  Attributes:
    config, workdir, steps, opened: the run's (`open_workdir`).
    records: its bookkeeping from this start on.
    writer: its metrics.jsonl and TensorBoard events.
    result: what `train_and_evaluate` returns, as of the last step ended (`end_step`).
  """
  config: run_config.RunConfig
  workdir: str
  steps: steps_lib.Steps
  opened: Opened
  records: recorder.Recorder
  writer: metrics_writer.MetricsWriter
  result: dict[str, Any]


@contextlib.contextmanager
def recording(config: run_config.RunConfig, workdir: str, steps: steps_lib.Steps, opened: Opened,
              progress: tqdm.tqdm, started: float) -> Iterator[Run]:
  """The `Run` of a train loop starting at `opened.state`'s step, its writer open for the block.

  `started` (time.perf_counter) is when this start of the run began: train records count the
  run's seconds from it, on top of those its earlier starts took to reach the first step.
  """
  first = int(opened.state["step"])
  records = recorder.Recorder(workdir, config.train, first, int(opened.state["num_skipped"]),
                              progress, opened.manager.latest_step, started)
  result = {
      "step": first, "preempted": False, "early_stopped": False,
      "train": records.last.get("train", {}),
      "validation": records.last.get(recorder.VALIDATION_SPLIT, {}), "validation_time_s": 0.0
  }
  with metrics_writer.MetricsWriter(workdir, resume_step=first) as writer:
    yield Run(config, workdir, steps, opened, records, writer, result)


def step_actions(step: int, train_config: ml_collections.ConfigDict,
                 preempted: bool) -> tuple[bool, bool, bool]:
  """(evaluate, save, log): what a run does after `step`.

  It validates every `eval_every_steps` and at the last step; saves then, every
  `checkpoint_every_steps` and when preempted; logs train metrics every `log_every_steps` and
  at every checkpoint, so a run resumed from a checkpoint averages over the same intervals as
  an uninterrupted one.
  """
  last = train_config.num_steps
  evaluate_now = _is_multiple(step, train_config.eval_every_steps, last)
  save_now = preempted or checkpoint_schedule.on_schedule(step, train_config)
  return evaluate_now, save_now, save_now or step % train_config.log_every_steps == 0


def end_step(run: Run, step: int, state: train_state.TrainState | None, preempted: bool) -> bool:
  """After `step` of `run`: logs, validates and saves (`step_actions`) and judges early stopping;
  returns whether the run stops here (`run.result` says why: early_stopped or preempted).

  Args:
    run: the run.
    step: the step just trained (its metrics pushed to `run.records`).
    state: the run's own state after `step`; read only at a step that logs, evaluates or saves
      (None at the others).
    preempted: whether to save and stop after this step.
  """
  evaluate_now, save_now, log_now = step_actions(step, run.config.train, preempted)
  train_config, result, manager = run.config.train, run.result, run.opened.manager
  if log_now:
    result["train"] = run.records.train_summary(int(state["num_skipped"]),
                                                train_state.applied_updates(state["opt_state"]))
    run.writer.write(step, "train", result["train"])
  eval_metrics = None
  if evaluate_now:
    start = time.perf_counter()
    validation = _validate(run.config, run.opened.task, run.steps, state)
    eval_metrics = result["validation"] = {**validation, "time_s": time.perf_counter() - start}
    result["validation_time_s"] += eval_metrics["time_s"]
    run.writer.write(step, recorder.VALIDATION_SPLIT, eval_metrics)
    run.records.add_validation(eval_metrics)
  if save_now:
    ranking = recorder.checkpoint_metrics(eval_metrics)
    checkpoints.save(manager, state, run.opened.train_iterator, metrics=ranking)
  if evaluate_now or save_now:
    run.records.restart_clock()
  result["step"] = step
  patience = train_config.early_stopping_patience
  if (evaluate_now and patience and
      recorder.evaluations_since_best(run.records.validation) >= patience):
    logging.warning("Early stop at step %d: %d evaluations without a better validation %s (%s).",
                    step, patience, "BLEU" if "bleu" in eval_metrics else "loss", run.workdir)
    result["early_stopped"] = True
    return True
  if preempted:
    logging.warning("Preempted: saved step %d to %s.", step, manager.directory)
    result["preempted"] = True
    return True
  return False


def stopped_early(run: Run) -> bool:
  """Whether `run` had stopped early at the step it resumes from (its last validation there
  the `train.early_stopping_patience`-th in a row without a better one): a start after such a
  stop, e.g. once its final evaluation was interrupted, trains no further (`run.result` says
  early_stopped), as the run never stopped would not have."""
  patience, validation = run.config.train.early_stopping_patience, run.records.validation
  if not (patience and validation and validation[-1]["step"] == run.result["step"] and
          recorder.evaluations_since_best(validation) >= patience):
    return False
  logging.warning(
      "Step %d of %s stopped early (%d evaluations without a better validation "
      "result): nothing to train.", run.result["step"], run.workdir, patience)
  run.result["early_stopped"] = True
  return True


def _train_loop(config: run_config.RunConfig, workdir: str, steps: steps_lib.Steps, opened: Opened,
                started: float) -> dict[str, Any]:
  """Runs steps from `opened.state["step"]` to `train.num_steps`; see `train_and_evaluate`.

  `started`: see `recording`. With `train.early_stopping_patience` = P > 0 the run stops
  (saved, `early_stopped: True`) at the first evaluation that is the P-th in a row without a
  better validation BLEU (without BLEU, `decode.validation_bleu=False`: lower validation loss;
  `recorder.evaluations_since_best`).
  """
  state, train_iterator = opened.state, opened.train_iterator
  first, last = int(state["step"]), config.train.num_steps
  with (progress_bar(first, last) as progress, Preemption() as
        preemption, recording(config, workdir, steps, opened, progress, started) as run):
    for step in range(first + 1, first if stopped_early(run) else last + 1):
      state, metrics = steps.train(state, steps.global_batch(next(train_iterator)))
      run.records.push(step, metrics)
      if end_step(run, step, state, preemption.reached(step)):
        break
    run.records.flush()
    checkpoints.wait(opened.manager)  # under the handler: a SIGTERM now cuts no save short
  check_interrupted(preemption, [run])
  return run.result


def check_interrupted(preemption: Preemption, runs: list[Run]) -> None:
  """Raises KeyboardInterrupt (naming what `runs` saved) when `preemption` caught SIGINT; marks
  `runs` preempted when it caught SIGTERM, also one that came during the last step's
  validation or save, after the loop last asked (the runs are saved: their callers stop, where
  a table would go on to their final evaluation). On several processes a SIGINT stops only at
  the step JAX's sync point names: one that named no step before the last goes unheeded, as
  every process goes on to the final evaluation together."""
  if preemption.several_processes and not any(r.result.get("preempted") for r in runs):
    if preemption.signal == "SIGINT":
      logging.warning("SIGINT came too late for a step before the last: every process goes on "
                      "to the final evaluation.")
    return
  if preemption.signal == "SIGTERM":
    for run in runs:
      run.result["preempted"] = True
  if preemption.signal == "SIGINT":
    saved = ", ".join(f"step {r.result['step']} to {r.opened.manager.directory}" for r in runs)
    raise KeyboardInterrupt(f"saved {saved}; run the same command again to resume.")
