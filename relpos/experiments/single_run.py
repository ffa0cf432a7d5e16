"""Trains and scores one (row, seed) of a table in its workdir, and writes its result.json:
the scores of every evaluation split of its task, its length diagnostics, its times and the
commits it ran under."""
import json
import os
import signal
import time
from typing import Any

import jax
import numpy as np
from absl import logging
from flax import nnx

from relpos import attention_statistics
from relpos import run_config
from relpos import device_mesh
from relpos import evaluate
from relpos import evaluation_files
from relpos import json_files
from relpos import locks
from relpos import metrics_writer
from relpos import preemption
from relpos import source_tree
from relpos import train
from relpos import workdir_files
from relpos.data import pipeline
from relpos.experiments import diagnostics
from relpos.experiments import results
from relpos.experiments import tables

# Held-out splits scored per dataset (`config.task.name`), the first the main one; of those a
# task may lack (the synthetic test_long_seen unless task.synthetic.num_test_long_seen), those
# it has (`eval_splits`).
EVAL_SPLITS = {
    "synthetic": ("test", "test_long", "test_long_seen"), "multi30k": ("test_2016_flickr",),
    "wmt14": ("test",)
}


def eval_splits(task: pipeline.Task) -> tuple[str, ...]:
  """The EVAL_SPLITS of `task` that it has."""
  return tuple(split for split in EVAL_SPLITS[task.name] if split in task.splits)


ANALYSIS_SENTENCES = 128
# Held by the process that runs in a workdir (others wait for it).
LOCK_FILE = "run.lock"


def train_steps_per_second(workdir: str) -> float | None:
  """Median training steps per second over the run's logged intervals (compilation and
  evaluation time excluded); None when no interval was timed."""
  speeds = [
      r["steps_per_second"]
      for r in metrics_writer.read_metrics(workdir)
      if r["split"] == "train" and r.get("steps_per_second") is not None
  ]
  return float(np.median(speeds)) if speeds else None


def validation_curve(workdir: str) -> list[list[float]]:
  """[[step, validation BLEU], ...] of the run's metrics.jsonl, in step order (a step logged
  again after a resume keeps its last record)."""
  by_step = {
      r["step"]: r["bleu"]
      for r in metrics_writer.read_metrics(workdir)
      if r["split"] == "validation" and "bleu" in r
  }
  return [[step, by_step[step]] for step in sorted(by_step)]


def score_checkpoint(
    workdir: str, config: run_config.RunConfig, task: pipeline.Task, checkpoint: str,
    mesh: jax.sharding.Mesh
) -> tuple[nnx.Module, dict[str, dict], dict[str, dict], dict[str, dict]]:
  """Scores one checkpoint choice of a run ("best", "latest", "average:N") on the validation
  split and every evaluation split of its task; each split's translations and scores go to
  `workdir/eval/` as `eval.py --checkpoint=<choice> --split=<split>` writes them.

  Returns:
    (the restored model, split -> sacreBLEU/chrF scores with the checkpoint's "step" (and
     "bleu_by_subset", `diagnostics.bleu_by_subset`, on test splits the task divides: the
     synthetic task's), split -> BLEU by source-length bucket (test splits),
     split -> `diagnostics.length_statistics` of the translations (test splits)).
  """
  model, step = evaluate.restore_model(workdir, config, checkpoint, mesh)
  scores, by_length, lengths = {}, {}, {}
  for split in ("validation",) + eval_splits(task):
    scored = evaluate.score_split(model, task, split, config, mesh=mesh)
    translations = scored.pop("translations")
    scores[split] = {**scored, "step": step}
    evaluation_files.write_evaluation(os.path.join(workdir, workdir_files.EVAL_DIR), workdir,
                                      config, checkpoint, step, translations, scored, split=split,
                                      sources=evaluate.sources_to_write(task, split))
    if split != "validation":
      sources, references = task.source_texts(split), task.target_texts(split)
      if subsets := task.subsets(split):
        by_subset = diagnostics.bleu_by_subset(translations, references, subsets,
                                               config.task.target_lang)
        scores[split]["bleu_by_subset"] = by_subset
      by_length[split] = diagnostics.bleu_by_source_length(sources, translations, references)
      lengths[split] = diagnostics.length_statistics(task.tokenizer, sources, translations,
                                                     references)
  return model, scores, by_length, lengths


def length_diagnostics(model: nnx.Module, config: run_config.RunConfig, task: pipeline.Task,
                       mesh: jax.sharding.Mesh) -> dict[str, Any]:
  """The length diagnostics of `relpos.experiments.diagnostics` on every test split.

  Returns:
    {"oracle_length": split -> scores at the references' lengths (with
     "bleu_by_source_length"), "token_accuracy_by_position": split -> teacher-forced accuracy
     by target position (up to 2 x task.max_length), "attention_profile": split -> the
     encoder's attention on up to ANALYSIS_SENTENCES of its sources}.
  """
  out = {"oracle_length": {}, "token_accuracy_by_position": {}, "attention_profile": {}}
  for split in eval_splits(task):
    out["oracle_length"][split] = diagnostics.oracle_length_scores(model, task, split, config,
                                                                   mesh=mesh)
    out["token_accuracy_by_position"][split] = diagnostics.token_accuracy_by_position(
        model, task, split, batch_size=config.train.eval_batch_size,
        num_positions=2 * config.task.max_length)
    sources = task.source_texts(split)[:ANALYSIS_SENTENCES]
    _, inputs = next(evaluate.source_batches(task.tokenizer, sources, len(sources)))
    out["attention_profile"][split] = attention_statistics.attention_profile(model, inputs)
  return out


def evaluate_run(workdir: str) -> dict[str, Any]:
  """Scores a run's `decode.checkpoint` (the best by validation BLEU unless set to 'latest' or
  'average:N') on every evaluation split of its task, and each of `decode.other_checkpoints`,
  with the length diagnostics of `length_diagnostics` when `decode.length_diagnostics`.

  Returns:
    {"scores": split -> sacreBLEU/chrF scores, "bleu_by_source_length": split -> BLEU by
     source-length bucket (test splits), "length_statistics": split -> hypothesis/reference
     length ratio and early/late stops (test splits), "other_checkpoints": choice -> split ->
     scores, "position_statistics": the encoder's on up to ANALYSIS_SENTENCES validation
     sources, "num_params": the model's number of parameters, and `length_diagnostics`'s
     "oracle_length", "token_accuracy_by_position", "attention_profile"}.
  """
  config = run_config.load(workdir)
  mesh = device_mesh.make_mesh()
  task = pipeline.get_task(config.task)
  model, scores, by_length, lengths = score_checkpoint(workdir, config, task,
                                                       config.decode.checkpoint, mesh)
  others = {
      choice: score_checkpoint(workdir, config, task, choice, mesh)[1]
      for choice in config.other_checkpoints()
  }
  sources = task.source_texts("validation")[:ANALYSIS_SENTENCES]
  _, inputs = next(evaluate.source_batches(task.tokenizer, sources, len(sources)))
  num_params = sum(p.size for p in jax.tree.leaves(nnx.state(model, nnx.Param)))
  return {
      "scores": scores, "bleu_by_source_length": by_length, "length_statistics": lengths,
      "other_checkpoints": others,
      "position_statistics": attention_statistics.position_statistics(model, inputs),
      "num_params": num_params,
      **(length_diagnostics(model, config, task, mesh) if config.decode.length_diagnostics else {})
  }


class StopRequested(BaseException):
  """SIGTERM arrived while a run was being evaluated (after its training was saved). Not an
  Exception: raised from the signal handler wherever evaluation is, it must pass the
  `except Exception` of what it interrupts (a checkpoint read would call it damage)."""


def _raise_stop(_: str) -> None:
  raise StopRequested()


def run_one(table: str, row: str, seed: int, task: str, workdir: str,
            overrides: dict[str, Any] | None = None,
            trained: dict[str, Any] | None = None) -> dict[str, Any] | None:
  """Trains and evaluates one run; returns (and writes) its result record.

  `trained`: what training returned (`train.train_and_evaluate`'s record) when the run was
  trained already, by `relpos.seed_stack.train_seeds` with its row's other seeds: it is then
  evaluated without training again.

  One process at a time runs in a workdir: this waits for the workdir's run lock, then returns
  the result already there when another process finished the run meanwhile.

  Returns None, writing nothing, when SIGTERM stopped it: during training after its checkpoint,
  during the final evaluation at once (its training is saved; a rerun evaluates it).
  """
  config = tables.one_run_config(row, seed, task, overrides)
  os.makedirs(workdir, exist_ok=True)
  with locks.hold(workdir, lock_file=LOCK_FILE, wait=True):
    if os.path.exists(os.path.join(workdir, results.RESULT_FILE)):
      return results.read_result(os.path.join(workdir, results.RESULT_FILE))
    summary = trained if trained is not None else train.train_and_evaluate(config, workdir)
    if summary["preempted"]:
      return None
    evaluation_start = time.time()
    try:
      with preemption.Preemption(signals=(signal.SIGTERM,), on_signal=_raise_stop):
        evaluation = evaluate_run(workdir)
    except StopRequested:
      logging.warning(
          "Stopped during the final evaluation of %s; its training is saved, and "
          "running the same command again evaluates it.", workdir)
      return None
    evaluation_s = time.time() - evaluation_start
    records = metrics_writer.read_metrics(workdir)
    training_s = metrics_writer.elapsed_seconds(records)
    validation_s = sum(r.get("time_s") or 0.0 for r in records if r["split"] == "validation")
    starts = metrics_writer.read_starts(workdir)
    result = {
        "table": table,
        "row": row,
        "seed": seed,
        "task": task,
        "k": config.model.max_relative_position if table == "k_sweep" else None,
        "commit": starts[-1]["commit"] if starts else source_tree.commit(),
        # Every start of the run (time, step, commit, host) and the commits in order.
        "starts": starts,
        "commits": list(dict.fromkeys(s["commit"] for s in starts)),
        # Seconds over every start of the run (`metrics_writer.elapsed_seconds`; compilation
        # is inside each part): training steps and checkpoints, validation during training,
        # the final evaluation of every split (the last one).
        "wall_time_s": training_s + evaluation_s,
        "time_s": {
            "training": training_s - validation_s, "validation": validation_s,
            "evaluation": evaluation_s
        },
        "steps_per_second": train_steps_per_second(workdir),
        # The machine's load while those steps were timed (`relpos.experiments.timing`).
        "machine_load": metrics_writer.machine_load(records, starts),
        "validation_curve": validation_curve(workdir),
        **evaluation,
        "config": json.loads(config.to_json()),
        "workdir": results.relative_workdir(workdir),
        "environment": {**results.environment(), "finished_at": json_files.utc_now()},
    }
    json_files.write_json(os.path.join(workdir, results.RESULT_FILE), result, indent=1)
  return result
