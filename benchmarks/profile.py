"""Where the train step's time goes: a profile of `abs` against `rel_kv`, per kind of operation.

Runs the compiled train step of each variant under `jax.profiler` (a Perfetto trace, no
TensorFlow or TensorBoard needed), attributes every executed XLA instruction's time to a kind
(matmul, gather, scatter, reduction, transpose/copy, dropout RNG, elementwise) from its
instruction name and the JAX operation it came from, and reports milliseconds per step per kind
for both variants and their difference (medians over rounds taken in turns). Instructions that
only hold others (conditional, while, call) are left out so nothing is counted twice. Times
under the profiler run slower than unprofiled ones; the differences between kinds are what this
is for.
"""
import collections
import glob
import gzip
import json
import re
import tempfile
from typing import Any

import jax
import numpy as np

from benchmarks import common
from benchmarks import train_step

VARIANTS = ("abs", "rel_kv")
KINDS = ("matmul", "gather", "scatter", "reduction", "transpose/copy", "dropout RNG",
         "elementwise")
_CONTAINERS = re.compile(r"\b(conditional|while|call)\(")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = ")
_OP_NAME = re.compile(r'op_name="([^"]*)"')


def instruction_sources(hlo_text: str) -> dict[str, str]:
  """Instruction name -> the JAX operation path it came from ('' if none), leaving out
  instructions that only hold others."""
  sources = {}
  for line in hlo_text.splitlines():
    match = _INSTRUCTION.match(line)
    if match and not _CONTAINERS.search(line):
      op_name = _OP_NAME.search(line)
      sources[match.group(1)] = op_name.group(1) if op_name else ""
  return sources


def kind(instruction: str, source: str) -> str:
  """The kind of work an XLA instruction does, from its name and its JAX source path."""
  operation = source.rsplit("/", 1)[-1]
  if "_bernoulli" in source or "_uniform" in source or "threefry" in source:
    return "dropout RNG"
  if operation == "dot_general" or instruction.startswith("dot"):
    return "matmul"
  for name in ("scatter", "gather"):
    if name in instruction or operation == name:
      return name
  if "reduce" in instruction or operation.startswith("reduce"):
    return "reduction"
  if instruction.startswith(("copy", "transpose", "wrapped_copy", "bitcast_copy")):
    return "transpose/copy"
  return "elementwise"


def _trace_events(trace_dir: str) -> list[dict[str, Any]]:
  (path,) = glob.glob(f"{trace_dir}/**/*.trace.json.gz", recursive=True)
  with gzip.open(path, "rt", encoding="utf-8") as f:
    trace = json.load(f)
  return trace["traceEvents"] if isinstance(trace, dict) else trace


def profile_step(call, sources: dict[str, str], steps: int) -> dict[str, float]:
  """Seconds per step per kind, from `steps` profiled calls of `call` (already warm)."""
  with tempfile.TemporaryDirectory() as trace_dir:
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
      for _ in range(steps):
        common.block(call())
    events = _trace_events(trace_dir)
  seconds = collections.Counter({k: 0.0 for k in KINDS})
  for event in events:
    # Device traces (GPU) name the kernel and give the instruction in args['hlo_op'].
    name = (event.get("args") or {}).get("hlo_op", event.get("name"))
    if event.get("ph") == "X" and name in sources:
      seconds[kind(name, sources[name])] += event.get("dur", 0) * 1e-6 / steps
  return dict(seconds)


def run(*, quick: bool = False, task: str = "synthetic") -> dict[str, Any]:
  """Profiles the train step of `abs` and `rel_kv` on `task`'s model.

  The variants are profiled in turns (a few steps each, several rounds) and each kind's time is
  the median over the rounds, as the timings of `common.interleaved_medians` are.

  Returns:
    {'task', 'steps', 'rounds', 'records': [{variant, seconds_per_kind: {kind: s}, total,
    flops}]}.
  """
  steps, rounds = (2, 2) if quick else (4, 5)
  calls, sources, flops = {}, {}, {}
  for variant in VARIANTS:
    step = train_step.compiled_step(variant, task)
    holder = {"state": step.state}

    def call(step=step, holder=holder):
      holder["state"], metrics = step.compiled(holder["state"], step.batch)
      return metrics

    for _ in range(2):
      common.block(call())
    calls[variant] = call
    sources[variant] = instruction_sources(step.compiled.as_text())
    flops[variant] = common.compiled_stats(step.compiled)["flops"]
  profiles = {variant: [] for variant in VARIANTS}
  for turn in range(rounds):
    common.progress(f"profile {task}: round {turn + 1} of {rounds}")
    for variant in VARIANTS:
      profiles[variant].append(profile_step(calls[variant], sources[variant], steps))
  records = []
  for variant in VARIANTS:
    per_kind = {name: float(np.median([p[name] for p in profiles[variant]])) for name in KINDS}
    records.append({"variant": variant, "seconds_per_kind": per_kind,
                    "total": sum(per_kind.values()), "flops": flops[variant]})
  return {"task": task, "steps": steps * rounds, "rounds": rounds, "records": records}
