"""Where the train step's time goes: a profile of `abs` against `rel_kv`, per kind of operation.

Runs the compiled train step of each variant under `jax.profiler` (a Perfetto trace, no
TensorFlow or TensorBoard needed), attributes every executed XLA instruction's time to a kind
(matmul, gather, scatter, reduction, transpose/copy, dropout RNG, elementwise) from the
operations it executes (a fusion's: those it fuses), its result type and the JAX operation it
came from, and reports milliseconds per step per kind for both variants and their difference
(medians over rounds taken in turns). Instructions that only hold others (conditional, while,
call) are left out so nothing is counted twice. "dropout RNG" is every instruction that computes
the Threefry hash, with the masking (and on CPU the embedding lookup) fused into it. Times
under the profiler run slower than unprofiled ones; the differences between kinds are what
this is for.

`run` profiles the synthetic model; `run_recipe` the Multi30K recipe (`configs/multi30k_gpu.py`)
at its own batch, in float32 on a CPU: the step of the CPU Multi30K table.
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
KINDS = ("matmul", "gather", "scatter", "reduction", "transpose/copy", "dropout RNG", "elementwise")
_CONTAINERS = ("conditional", "while", "call")
_COMPUTATION = re.compile(r"^(?:ENTRY )?%([\w.\-]+) .*\{$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (\([^=]*?\)|\S+) ([\w\-]+)\(")
_CALLS = re.compile(r"calls=%([\w.\-]+)")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_RANDOM_BITS = re.compile(r"\(?u32\[\d")  # unsigned 32-bit arrays: the PRNG's raw bits
# The Threefry hash's rotations. Compiled unrolled (relpos.prng), the hash fuses into the
# instruction that applies its dropout mask (and, for the embeddings' dropout, into the
# embedding lookup); its 20 rounds per pair of words are most of such an instruction's work.
_HASH_OPERATIONS = {"shift-left", "shift-right-logical", "xor"}
_DATA_MOVEMENT = {
    "copy", "transpose", "bitcast", "reshape", "broadcast", "slice", "concatenate", "parameter",
    "constant", "tuple", "get-tuple-element"
}


def instruction_kinds(hlo_text: str) -> dict[str, str]:
  """Instruction name -> its `kind`, for the instructions of a compiled program's HLO text.

  A fusion is judged by the operations of the computation it calls. Instructions that only
  hold others (conditional, while, call) are left out, so that nothing is counted twice.
  """
  bodies, computation, lines = {}, None, []
  for line in hlo_text.splitlines():
    match = _INSTRUCTION.match(line)
    if match:
      lines.append((match, line))
      bodies.setdefault(computation, set()).add(match.group(3))
    else:
      header = _COMPUTATION.match(line)
      if header:
        computation = header.group(1)
  kinds = {}
  for match, line in lines:
    name, result_type, opcode = match.group(1), match.group(2), match.group(3)
    if opcode in _CONTAINERS:
      continue
    called = _CALLS.search(line)
    operations = bodies.get(called.group(1), {opcode}) if called else {opcode}
    op_name = _OP_NAME.search(line)
    kinds[name] = kind(operations, op_name.group(1) if op_name else "", result_type)
  return kinds


def kind(operations: set[str], source: str, result_type: str) -> str:
  """The kind of work an XLA instruction does.

  Args:
    operations: the HLO opcodes it executes (a fusion's: those of its fused computation).
    source: the JAX operation path it came from (HLO metadata op_name), '' if none.
    result_type: the HLO type of its result, e.g. 'f32[32,48]{1,0}'.
  """
  if ("_bernoulli" in source or "_uniform" in source or "threefry" in source or
      _RANDOM_BITS.match(result_type) or _HASH_OPERATIONS <= operations):
    return "dropout RNG"
  if operations & {"dot", "convolution"}:
    return "matmul"
  for name in ("scatter", "gather"):
    if name in operations:
      return name
  if operations & {"reduce", "reduce-window"}:
    return "reduction"
  if operations <= _DATA_MOVEMENT:
    return "transpose/copy"
  return "elementwise"


def _trace_events(trace_dir: str) -> list[dict[str, Any]]:
  (path,) = glob.glob(f"{trace_dir}/**/*.trace.json.gz", recursive=True)
  with gzip.open(path, "rt", encoding="utf-8") as f:
    trace = json.load(f)
  return trace["traceEvents"] if isinstance(trace, dict) else trace


def profile_step(call, kinds: dict[str, str], steps: int) -> dict[str, float]:
  """Seconds per step per kind, from `steps` profiled calls of `call` (already warm).

  Args:
    call: runs the program once.
    kinds: `instruction_kinds` of the program.
    steps: calls to profile.
  """
  with tempfile.TemporaryDirectory() as trace_dir:
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
      for _ in range(steps):
        common.block(call())
    events = _trace_events(trace_dir)
  seconds = collections.Counter({k: 0.0 for k in KINDS})
  for event in events:
    # Device traces (GPU) name the kernel and give the instruction in args['hlo_op'].
    name = (event.get("args") or {}).get("hlo_op", event.get("name"))
    if event.get("ph") == "X" and name in kinds:
      seconds[kinds[name]] += event.get("dur", 0) * 1e-6 / steps
  return dict(seconds)


def run(*, quick: bool = False, task: str | None = None) -> dict[str, Any]:
  """Profiles the train step of `abs` and `rel_kv` on `task`'s model (default: the synthetic
  model on a CPU, the Multi30K GPU recipe on an accelerator).

  The variants are profiled in turns (a few steps each, several rounds) and each kind's time is
  the median over the rounds, as the timings of `common.interleaved_medians` are.

  Returns:
    {'task', 'steps', 'rounds', 'records': [{variant, seconds_per_kind: {kind: s}, total,
    flops}], 'batch_size', 'length', 'dtype'}.
  """
  task = task or ("synthetic" if jax.default_backend() == "cpu" else "multi30k_gpu")
  steps, rounds = (2, 2) if quick else (4, 5)
  calls, kinds, flops = {}, {}, {}
  for variant in VARIANTS:
    step = train_step.compiled_step(variant, task)
    calls[variant] = train_step.caller(step)
    for _ in range(2):
      common.block(calls[variant]())
    kinds[variant] = instruction_kinds(step.compiled.as_text())
    flops[variant] = common.compiled_stats(step.compiled)["flops"]
    config = step.config  # the same model size, batch and dtype for every variant
  profiles = {variant: [] for variant in VARIANTS}
  for turn in range(rounds):
    common.progress(f"profile {task}: round {turn + 1} of {rounds}")
    for variant in VARIANTS:
      profiles[variant].append(profile_step(calls[variant], kinds[variant], steps))
  records = []
  for variant in VARIANTS:
    per_kind = {name: float(np.median([p[name] for p in profiles[variant]])) for name in KINDS}
    records.append({
        "variant": variant, "seconds_per_kind": per_kind, "total": sum(per_kind.values()),
        "flops": flops[variant]
    })
  return {
      "task": task, "steps": steps * rounds, "rounds": rounds, "records": records,
      "batch_size": config.train.batch_size, "length": config.task.max_length,
      "dtype": config.model.dtype
  }


def run_recipe(*, quick: bool = False) -> dict[str, Any]:
  """`run` on the Multi30K recipe (`configs/multi30k_gpu.py`, its batch; float32 on a CPU)."""
  return run(quick=quick, task="multi30k_gpu")
