"""Shared benchmark helpers: interleaved timing, compiled-program statistics, machine facts.

Timings on a shared machine are noisy, so every section times its variants side by side:
`interleaved_medians` runs one call of each variant per round, for several rounds, and keeps the
median per variant; ratios are taken between medians of the same run.
"""
import os
import platform
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from relpos import json_files


def block(tree: Any) -> Any:
  """Waits for every array of `tree` (asynchronous dispatch) and returns it."""
  return jax.block_until_ready(tree)


def interleaved_medians(calls: dict[str, Callable[[], Any]], *, rounds: int,
                        warmup: int = 1) -> dict[str, float]:
  """Median seconds per call of each variant, rounds interleaved (variant a, b, c, a, b, c...).

  Args:
    calls: variant name -> a zero-argument function running one (already compiled) call.
    rounds: timed calls per variant (>= 1).
    warmup: untimed calls per variant before timing.

  Returns:
    variant name -> median wall-clock seconds.
  """
  for call in calls.values():
    for _ in range(warmup):
      block(call())
  times = {name: [] for name in calls}
  for _ in range(rounds):
    for name, call in calls.items():
      start = time.perf_counter()
      block(call())
      times[name].append(time.perf_counter() - start)
  return {name: float(np.median(values)) for name, values in times.items()}


def compiled_stats(compiled: jax.stages.Compiled) -> dict[str, float | None]:
  """XLA's temporary buffer bytes (`memory_analysis`) and FLOPs (`cost_analysis`) of a program.

  Values the backend does not report are None.
  """
  memory = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):  # older JAX: one dict per computation
    cost = cost[0] if cost else {}
  flops = (cost or {}).get("flops")
  return {
      "temp_bytes": None if memory is None else int(memory.temp_size_in_bytes),
      "flops": None if flops is None else float(flops)
  }


def load() -> list[float]:
  """1, 5 and 15 minute load averages (other processes share the CPU)."""
  return [round(x, 2) for x in os.getloadavg()]


def machine() -> dict[str, Any]:
  """Facts needed to read the numbers: host, CPU count, JAX version and devices."""
  devices = jax.devices()
  return {
      "platform": platform.platform(), "processor": platform.processor() or platform.machine(),
      "cpu_count": os.cpu_count(), "python": platform.python_version(), "jax": jax.__version__,
      "backend": jax.default_backend(), "devices": [str(d.device_kind) for d in devices],
      "date": json_files.utc_now()
  }


def progress(message: str) -> None:
  """One line of progress on stdout, with the current load."""
  print(f"[{time.strftime('%H:%M:%S')} load {load()[0]:.1f}] {message}", flush=True)
