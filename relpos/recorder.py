"""The training loop's bookkeeping on the host: each step's train metrics (finiteness, means
over a log interval, steps per second, the run's seconds) and the validation history that
early stopping and the best checkpoint are judged by.

A resumed run reads its history back from `metrics.jsonl` (`relpos.metrics_writer`), so its
records, its early stopping and its seconds continue as if it had never stopped.
"""
import math
import time
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import tqdm

from relpos import checkpoints
from relpos import metrics_writer
from relpos import train_state

VALIDATION_SPLIT = "validation"


class NonFiniteError(FloatingPointError):
  """A non-finite loss, gradient or updated parameters with `train.nonfinite='raise'`, or too
  many skipped updates with 'skip'."""


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


def checkpoint_metrics(eval_metrics: dict[str, Any] | None) -> dict[str, float] | None:
  """The numbers `checkpoints.best_metric` ranks a checkpoint by (None without an evaluation)."""
  if eval_metrics is None:
    return None
  return {k: eval_metrics[k] for k in ("bleu", "loss") if k in eval_metrics}


class Recorder:
  """Host side of a run's metrics from its first step of this start on.

  Step t's metrics are read after step t + 1 is dispatched, so the host never stalls the
  device except at log, eval and checkpoint steps.

  Attributes:
    last: split -> the metrics of its last record ("train", "validation"; empty before one).
    validation: the validation metrics so far, in order (those of earlier starts included).
  """
  def __init__(self, workdir: str, train_config: ml_collections.ConfigDict, first_step: int,
               num_skipped: int, progress: tqdm.tqdm, last_checkpoint: Callable[[], Any],
               started: float):
    """Starts recording, with the history of `workdir/metrics.jsonl` up to `first_step`.

    Args:
      workdir: the run's folder.
      train_config: `train.*` of the run (nonfinite, max_skipped_fraction, num_steps and the
        learning-rate schedule's fields).
      first_step: the step this start begins from (0 for a fresh run).
      num_skipped: updates skipped before this start (of a resumed run).
      progress: the progress bar.
      last_checkpoint: returns the step of the latest checkpoint (None before the first).
      started: time.perf_counter() when this start of the run began; the run's seconds add
        the time since then to what its earlier starts took to reach `first_step`.
    """
    self._train_config = train_config
    self._schedule = train_state.learning_rate_schedule(train_config)
    self._num_skipped = num_skipped
    self._progress = progress
    self._last_checkpoint = last_checkpoint
    self._started = started
    earlier = [r for r in metrics_writer.read_metrics(workdir) if r["step"] <= first_step]
    self._earlier_s = metrics_writer.elapsed_seconds(earlier)
    self.last = {
        r["split"]: {k: v for k, v in r.items() if k not in ("step", "split")} for r in earlier
    }
    self.validation = [r for r in earlier if r["split"] == VALIDATION_SPLIT]
    self._pending: tuple[int, dict[str, jax.Array]] | None = None
    self._sums = {"loss": 0.0, "grad_norm": 0.0}
    self._counts = {k: 0 for k in self._sums}
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
    for k in self._sums:  # a float16 loss-scale overflow: a finite step of infinite grad_norm
      if math.isfinite(metrics[k]):
        self._sums[k] += metrics[k]
        self._counts[k] += 1
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

  def train_summary(self, num_skipped: int, applied_updates: int) -> dict[str, float | None]:
    """The train record of a logging step: means over the finite steps since the last summary (None
    when every step was skipped) of `smoothed_loss` (the label-smoothed training objective per
    target token; validation's `loss` is the plain cross-entropy) and `grad_norm`; training
    steps per second (None when no step was timed); `skipped_updates` so far; the next
    update's `learning_rate` (the schedule at `applied_updates`,
    `train_state.applied_updates`: float16 loss-scale overflows, not counted as skipped, do
    not advance it either); the run's seconds so far, `elapsed_s`
    (`metrics_writer.elapsed_seconds`); and the machine's `load_average` now
    (`metrics_writer.load_average`), which says whether the steps were timed alone."""
    self.flush()
    means = {k: v / self._counts[k] if self._counts[k] else None for k, v in self._sums.items()}
    elapsed = time.perf_counter() - self._start if self._start is not None else 0.0
    summary = {
        "smoothed_loss": means["loss"], "grad_norm": means["grad_norm"],
        "steps_per_second": self._steps_timed / elapsed if self._steps_timed else None,
        "skipped_updates": num_skipped, "learning_rate": float(self._schedule(applied_updates)),
        "elapsed_s": self._earlier_s + time.perf_counter() - self._started,
        "load_average": metrics_writer.load_average()
    }
    self._sums = {k: 0.0 for k in self._sums}
    self._counts = {k: 0 for k in self._sums}
    if self._start is not None:
      self.restart_clock()
    self.last["train"] = summary
    return summary

  def add_validation(self, metrics: dict[str, Any]) -> None:
    """Records an evaluation's validation metrics."""
    self.last[VALIDATION_SPLIT] = metrics
    self.validation.append(metrics)
