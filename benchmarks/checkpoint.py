"""What a checkpoint save costs a training run: the train state of the synthetic model and of
the Multi30K recipe (`configs/multi30k_gpu.py`; the `abs` row: parameters, Adam's moments,
step, dropout key; float32 on a CPU) saved as training saves it (`relpos.checkpoints.save`,
with a data iterator's position).

The save blocks the step while the arrays are copied to host memory; Orbax writes them in the
background while training goes on. Both are timed: the blocking call, and until the files are
written (`checkpoints.wait`); a run of the Multi30K recipe saves every 100 steps (80 times).
"""
import statistics
import tempfile
import time
from typing import Any

import grain
import jax

from benchmarks import common
from benchmarks import train_step
from relpos import checkpoints
from relpos import device_mesh
from relpos import run_config
from relpos import steps as steps_lib

TASKS = ("synthetic", "multi30k_gpu")


def run_task(task: str, *, saves: int) -> dict[str, Any]:
  """Saves `task`'s train state `saves` times into a temporary workdir, one at a time.

  Returns:
    {'task', 'state_mib', 'saves', 'blocking_seconds', 'written_seconds'}: the medians of the
    save call and of the time until its files were written.
  """
  config = train_step.row_config("abs", task)
  steps = steps_lib.get_steps(device_mesh.make_mesh(),
                              run_config.validate(config).model, config.train)
  state = jax.block_until_ready(steps.init(config.seed))
  data = iter(grain.MapDataset.range(100).to_iter_dataset())
  blocking, written = [], []
  common.progress(f"checkpoint {task}: {saves} saves")
  with tempfile.TemporaryDirectory() as workdir:
    manager = checkpoints.make_manager(workdir, keep=1)
    for save in range(1, saves + 1):
      state = {**state, "step": jax.numpy.int32(100 * save)}
      start = time.perf_counter()
      checkpoints.save(manager, state, data)
      blocking.append(time.perf_counter() - start)
      checkpoints.wait(manager)
      written.append(time.perf_counter() - start)
    manager.close()
  size = sum(leaf.nbytes for leaf in jax.tree.leaves(state))
  return {
      "task": task, "state_mib": size / 2**20, "saves": saves,
      "blocking_seconds": statistics.median(blocking), "written_seconds": statistics.median(written)
  }


def run(*, quick: bool = False, saves: int | None = None) -> dict[str, Any]:
  """The checkpoint benchmark of the models of TASKS; see `run_task`."""
  return {"records": [run_task(task, saves=saves or (3 if quick else 7)) for task in TASKS]}
