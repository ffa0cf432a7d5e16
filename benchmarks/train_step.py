"""The train step of the default (synthetic) and Multi30K models, per position variant.

On a CPU the Multi30K model is `configs/multi30k.py` at a cut batch; on an accelerator it is the
GPU recipe `configs/multi30k_gpu.py` (bfloat16, cuDNN attention where it runs) at its own batch.
Uses the library's own compiled step (`relpos.steps.Steps`: forward, backward, optimizer update,
dropout on) on packed batches shaped like the task's (random tokens, segments of 3 to 20 tokens
packed into rows of `task.max_length`). Variants are timed interleaved; steps/s are reported
relative to `abs` of the same model and run.
"""
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import ml_collections
import numpy as np

from benchmarks import common
from configs import ablation
from relpos import run_config
from relpos import device_mesh
from relpos import steps as steps_lib
from relpos.data import pipeline

VARIANTS = ("abs", "rel_kv", "rel_k", "rel_v", "t5", "rope", "alibi", "none")
QUICK_VARIANTS = ("abs", "rel_kv", "t5")
# Task (a base of configs/ablation.py) -> rows per step (None: the config's). On a CPU
# Multi30K's 128 rows take seconds per step; the ratio between variants is what this measures,
# so its batch is cut (and said so in the output).
CPU_BATCH_SIZES = {"synthetic": None, "multi30k": 16}
ACCELERATOR_BATCH_SIZES = {"synthetic": None, "multi30k_gpu": None}
EOS_ID = 1


def batch_sizes() -> dict[str, int | None]:
  """The tasks measured on this backend and their rows per step."""
  return CPU_BATCH_SIZES if jax.default_backend() == "cpu" else ACCELERATOR_BATCH_SIZES


def packed_batch(rows: int, length: int, vocab_size: int, seed: int = 0) -> dict[str, np.ndarray]:
  """A packed batch (the six keys, int32 [rows, length]) of random sentences of 3-20 tokens.

  Each row holds whole segments (positions restarting at 0, segment ids 1, 2, ...) followed by
  padding (token, position and segment 0), like the packing of `relpos.data.pipeline`.
  """
  rng = np.random.default_rng(seed)
  batch = {key: np.zeros((rows, length), np.int32) for key in pipeline.BATCH_KEYS}
  for row in range(rows):
    for side in ("inputs", "targets"):
      start, segment = 0, 1
      while True:
        size = int(rng.integers(3, 21))
        if start + size > length:
          break
        span = slice(start, start + size)
        batch[side][row, span] = rng.integers(3, vocab_size, size)
        batch[side][row, start + size - 1] = EOS_ID
        batch[f"{side}_position"][row, span] = np.arange(size)
        batch[f"{side}_segmentation"][row, span] = segment
        start, segment = start + size, segment + 1
  return batch


def row_config(row: str, task: str) -> ml_collections.ConfigDict:
  """Row `row` of `task` at the batch `batch_sizes` gives it; on a CPU in float32, as the CPU
  tables run it (XLA:CPU emulates bfloat16 matmuls)."""
  config = ablation.get_config(f"{row},{task}")
  if batch_sizes().get(task) is not None:
    config.train.batch_size = batch_sizes()[task]
  if jax.default_backend() == "cpu":
    config.model.dtype = "float32"
  return config


class CompiledStep(NamedTuple):
  """One variant's compiled train step with a state and a packed batch to call it on, and the
  `Steps` it was compiled from."""
  compiled: jax.stages.Compiled
  state: Any
  batch: dict[str, jax.Array]
  config: ml_collections.ConfigDict
  steps: steps_lib.Steps


def compiled_step(row: str, task: str) -> CompiledStep:
  """Compiles the train step of ablation row `row` on `task`'s model (over all devices)."""
  config = row_config(row, task)
  model_config = run_config.validate(config).model
  steps = steps_lib.get_steps(device_mesh.make_mesh(), model_config, config.train)
  batch = steps.global_batch(
      packed_batch(config.train.batch_size, config.task.max_length, model_config.vocab_size))
  state = steps.init(config.seed)
  return CompiledStep(steps.train.lower(state, batch).compile(), state, batch, config, steps)


def caller(step: CompiledStep) -> Callable[[], Any]:
  """A zero-argument function running `step` once, each call on the state the last one left;
  returns the step's metrics."""
  holder = {"state": step.state}

  def call() -> Any:
    holder["state"], metrics = step.compiled(holder["state"], step.batch)
    return metrics

  return call


def run_task(task: str, *, variants: tuple[str, ...], rounds: int) -> dict[str, Any]:
  """Times the train step of every variant of one task's model.

  Returns:
    {'task', 'batch_size', 'length', 'model': {...}, 'records': [{variant, seconds,
    steps_per_second, time_ratio (to abs), flops, temp_bytes}]}.
  """
  calls, stats, config = {}, {}, None
  for row in variants:
    step = compiled_step(row, task)
    config = step.config
    stats[row] = common.compiled_stats(step.compiled)
    calls[row] = caller(step)
  common.progress(f"train step {task}: timing {len(calls)} variants")
  seconds = common.interleaved_medians(calls, rounds=rounds, warmup=2)
  records = []
  for row in variants:
    records.append({
        "variant": row, "seconds": seconds[row], "steps_per_second": 1 / seconds[row],
        "time_ratio": seconds[row] / seconds["abs"],
        "flops_ratio": stats[row]["flops"] / stats["abs"]["flops"]
                       if stats[row]["flops"] and stats["abs"]["flops"] else None, **stats[row]
    })
  model = {
      k: v
      for k, v in config.model.items()
      if k in ("emb_dim", "num_heads", "qkv_dim", "mlp_dim", "num_encoder_layers",
               "num_decoder_layers", "max_relative_position", "dtype")
  }
  return {
      "task": task, "batch_size": config.train.batch_size, "length": config.task.max_length,
      "model": model, "devices": len(jax.devices()), "records": records
  }


def run(*, quick: bool = False, rounds: int | None = None) -> dict[str, Any]:
  """Train-step benchmark of both models; see `run_task`."""
  variants = QUICK_VARIANTS if quick else VARIANTS
  sizes = batch_sizes()
  results = [
      run_task(task, variants=variants, rounds=rounds or (3 if quick else 7)) for task in sizes
  ]
  notes = [
      f"{task}: batch {rows} rows instead of the config's (CPU time); ratios between "
      f"variants are what is compared." for task, rows in sizes.items() if rows
  ]
  return {"tasks": results, "notes": notes}
