"""A run saved by an earlier commit of relpos, kept in tests/saved_runs/: today's code restores
its checkpoint, computes the same logits from it and resumes its training as the run went on
when it was made (tests/test_checkpoints.py). A long table resumes across commits this way.

The run: the tiny config with Shaw et al.'s relative positions (a^K and a^V), trained 16 steps;
the folder keeps its config.json, its step-12 checkpoint (parameters, optimizer state, data
iterator) and expected.json: the logits of `BATCH` from step 12, the training loss logged at
steps 14 and 16 by the uninterrupted run, and the commit that made it. Made in a clean checkout
by

    XLA_FLAGS=--xla_force_host_platform_device_count=4 python tests/saved_run.py \
        tests/saved_runs/<name>

A change that cannot read a saved run changes the checkpoint format: it needs a conversion for
the runs researchers have saved, not a new folder here.
"""
import os
import shutil
import sys
import tempfile

import jax.numpy as jnp
import numpy as np

FOLDER = os.path.join(os.path.dirname(__file__), "saved_runs", "tiny_relative_2026-11-26")
RESTORED_STEP = 12
NUM_STEPS = 16
# Source and target token ids [2, 6] (the tiny vocabulary has 64; 0 pads).
BATCH = {
    "inputs": [[5, 9, 17, 33, 2, 0], [12, 40, 7, 2, 0, 0]],
    "targets": [[6, 21, 8, 30, 11, 2], [19, 4, 2, 0, 0, 0]],
}
LOGITS_KEPT = 8  # logits of the first 8 vocabulary entries at every target position


def config(data_dir: str):
  """The saved run's config: tiny, relative positions, 16 steps, checkpoints every 4."""
  from configs import tiny  # pylint: disable=import-outside-toplevel
  result = tiny.get_config()
  result.model.position = "relative"
  result.task.tfds_data_dir = data_dir
  result.train.update(num_steps=NUM_STEPS, checkpoint_every_steps=4, keep_checkpoints=4)
  return result


def logits(model) -> np.ndarray:
  """Logits [2, 6, LOGITS_KEPT] of `BATCH` (deterministic forward pass)."""
  inputs, targets = (jnp.asarray(BATCH[name], jnp.int32) for name in ("inputs", "targets"))
  return np.asarray(model(inputs, targets, deterministic=True))[..., :LOGITS_KEPT]


def train_losses(records, after_step: int) -> dict[str, float]:
  """{step: smoothed training loss} of the train records logged after `after_step`."""
  return {
      str(r["step"]): r["smoothed_loss"]
      for r in records
      if r["split"] == "train" and r["step"] > after_step
  }


def make(folder: str) -> None:
  """Trains the run in a temporary folder and keeps what the test needs in `folder`."""
  # pylint: disable=import-outside-toplevel
  from relpos import device_mesh, evaluate, json_files, metrics_writer, run_config, source_tree
  from relpos import train
  with tempfile.TemporaryDirectory() as scratch:
    workdir = os.path.join(scratch, "run")
    train.train_and_evaluate(config(os.path.join(scratch, "data")), workdir)
    saved = run_config.load(workdir)
    model, step = evaluate.restore_model(workdir, saved, RESTORED_STEP, device_mesh.make_mesh())
    assert step == RESTORED_STEP
    os.makedirs(folder)
    shutil.copytree(os.path.join(workdir, "checkpoints", str(RESTORED_STEP)),
                    os.path.join(folder, "checkpoints", str(RESTORED_STEP)))
    saved_config = json_files.read_json(os.path.join(workdir, "config.json"))
    saved_config["task"]["tfds_data_dir"] = ""  # the test's own data folder
    json_files.write_json(os.path.join(folder, "config.json"), saved_config, indent=1,
                          sort_keys=True)
    json_files.write_json(
        os.path.join(folder, "expected.json"), {
            "made_at_commit": source_tree.commit(),
            "logits": logits(model).tolist(),
            "train_loss": train_losses(metrics_writer.read_metrics(workdir), RESTORED_STEP),
        }, indent=1, sort_keys=True)


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  make(sys.argv[1])
