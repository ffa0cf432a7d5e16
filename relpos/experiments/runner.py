"""Runs a table of (row, seed) experiments, resumable, into one output directory.

Layout of `output_dir`:

  runs/<table>-<row>-seed<seed>/          the run's workdir (config.json, checkpoints, metrics)
  runs/<table>-<row>-seed<seed>/result.json   written last: its presence marks the run finished
  results.json   every finished run (rebuilt from the result.json files)
  table.md       made from results.json alone (`relpos.experiments.report`)
  *.png          plots (`relpos.experiments.plots`, `relpos.experiments.analysis`)

A run whose `result.json` exists is skipped, so an interrupted sweep resumes where it stopped
(and a run killed mid-training resumes from its own latest checkpoint).
"""

import json
import math
import os
import subprocess
import time
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
import sacrebleu
from flax import nnx
from absl import logging

from configs import ablation
from relpos import config_validation
from relpos import evaluate
from relpos import metrics_writer
from relpos import train
from relpos.data import pipeline
from relpos.experiments import analysis
from relpos.experiments import plots
from relpos.experiments import report

TABLES: dict[str, tuple[str, ...]] = {
    "ablation": ("abs", "rel_kv", "rel_k", "rel_v", "none", "t5", "abs_rel_kv", "rope", "alibi"),
    "k_sweep": tuple(f"k={k}" for k in ablation.K_GRID),
}
EVAL_SPLITS = {"synthetic": ("test", "test_long"), "multi30k": ("test_2016_flickr",),
               "wmt14": ("test",)}
NUM_LENGTH_BUCKETS = 4
ANALYSIS_SENTENCES = 128


def commit() -> str:
  """The source tree's short commit, with `-dirty` when it has uncommitted changes."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  try:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, check=True,
                          capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                           check=True, capture_output=True, text=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown"
  return head + ("-dirty" if dirty else "")


def run_config(row: str, seed: int, task: str,
               overrides: dict[str, Any] | None = None) -> ml_collections.ConfigDict:
  """The config of one run: the ablation row on `task`, seeded, with dotted-key overrides.

  Raises:
    ValueError: for an unknown row, task or override field, or an override of another type.
  """
  config = ablation.get_config(f"{row},{task}")
  config.seed = seed
  for dotted, value in (overrides or {}).items():
    parent = config
    *path, leaf = dotted.split(".")
    for name in path:
      if name not in parent:
        raise ValueError(f"override {dotted!r}: no config field {name!r}.")
      parent = parent[name]
    if leaf not in parent:
      raise ValueError(f"override {dotted!r}: no config field {leaf!r}.")
    try:
      parent[leaf] = value
    except TypeError:  # ConfigDict refuses a value of another type
      raise ValueError(f"override {dotted}={value!r}: the field holds "
                       f"{type(parent[leaf]).__name__} values, e.g. {parent[leaf]!r}.") from None
  return config


def length_edges(sources: Sequence[str], num_buckets: int = NUM_LENGTH_BUCKETS) -> list[int]:
  """Lower bounds of equal-width source-length buckets (words) covering `sources`."""
  lengths = [len(s.split()) for s in sources]
  low, high = min(lengths), max(lengths)
  width = max(1, math.ceil((high - low + 1) / num_buckets))
  return list(range(low, high + 1, width))


def bleu_by_source_length(sources: Sequence[str], hypotheses: Sequence[str],
                          references: Sequence[str]) -> dict[str, float]:
  """Corpus sacreBLEU per source-length bucket, keyed "low-high" (words, inclusive)."""
  edges = length_edges(sources)
  uppers = [e - 1 for e in edges[1:]] + [max(len(s.split()) for s in sources)]
  out = {}
  for low, high in zip(edges, uppers):
    picked = [i for i, s in enumerate(sources) if low <= len(s.split()) <= high]
    if picked:
      out[f"{low}-{high}"] = sacrebleu.corpus_bleu(
          [hypotheses[i] for i in picked], [[references[i] for i in picked]]).score
  return out


def _write_json(path: str, data: Any) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(data, f, indent=1)
  os.replace(tmp, path)


def train_steps_per_second(workdir: str) -> float:
  """Median training steps per second over the run's logged intervals (robust to the
  intervals that include an evaluation or a compilation)."""
  speeds = [r["steps_per_second"] for r in metrics_writer.read_metrics(workdir)
            if r["split"] == "train"]
  return float(np.median(speeds))


def evaluate_best(workdir: str) -> tuple[dict, dict, dict, int]:
  """Scores the best checkpoint of a run on every evaluation split of its task.

  Returns:
    (split -> sacreBLEU/chrF scores, split -> BLEU by source-length bucket (test splits),
     the encoder's position statistics on up to ANALYSIS_SENTENCES validation sources,
     the model's number of parameters).
  """
  config = evaluate.load_run_config(workdir)
  mesh = evaluate.make_mesh()
  task = pipeline.get_task(config.task)
  model, step = evaluate.restore_model(workdir, config, "best", mesh)
  scores, by_length = {}, {}
  for split in ("validation",) + EVAL_SPLITS[config.task.name]:
    scored = evaluate.score_split(model, task, split, config, mesh=mesh)
    translations = scored.pop("translations")
    scores[split] = {**scored, "step": step}
    if split != "validation":
      by_length[split] = bleu_by_source_length(task.source_texts(split), translations,
                                               task.target_texts(split))
  sources = task.source_texts("validation")[:ANALYSIS_SENTENCES]
  _, inputs = next(evaluate.source_batches(task.tokenizer, sources, len(sources)))
  num_params = sum(p.size for p in jax.tree.leaves(nnx.state(model, nnx.Param)))
  return scores, by_length, analysis.position_statistics(model, inputs), num_params


def run_one(table: str, row: str, seed: int, task: str, workdir: str,
            overrides: dict[str, Any] | None = None) -> dict[str, Any] | None:
  """Trains and evaluates one run; returns (and writes) its result record.

  Returns None, writing nothing, when training was preempted (SIGTERM) after its checkpoint.
  """
  config = run_config(row, seed, task, overrides)
  source_commit = commit()  # the code the run starts with
  start = time.time()
  summary = train.train_and_evaluate(config, workdir)
  if summary["preempted"]:
    return None
  scores, by_length, statistics, num_params = evaluate_best(workdir)
  result = {
      "table": table, "row": row, "seed": seed, "task": task,
      "k": config.model.max_relative_position if table == "k_sweep" else None,
      "commit": source_commit, "wall_time_s": time.time() - start,
      "steps_per_second": train_steps_per_second(workdir), "num_params": num_params,
      "scores": scores, "bleu_by_source_length": by_length, "position_statistics": statistics,
      "config": json.loads(config.to_json()), "workdir": os.path.abspath(workdir),
  }
  _write_json(os.path.join(workdir, "result.json"), result)
  return result


def _read_result(path: str) -> dict[str, Any]:
  """A run's result.json.

  Raises:
    ValueError: naming the file when it is not whole JSON.
  """
  with open(path, encoding="utf-8") as f:
    try:
      return json.load(f)
    except ValueError as e:
      raise ValueError(f"{path} is not valid JSON ({e}): delete it to run that run's "
                       "evaluation again.") from None


def collect(output_dir: str) -> list[dict[str, Any]]:
  """Every finished run under `output_dir/runs`, in table and row order."""
  runs_dir = os.path.join(output_dir, "runs")
  runs = []
  for name in sorted(os.listdir(runs_dir)) if os.path.isdir(runs_dir) else []:
    path = os.path.join(runs_dir, name, "result.json")
    if os.path.exists(path):
      runs.append(_read_result(path))
  order = {(t, r): i for i, (t, r) in enumerate((t, r) for t in TABLES for r in TABLES[t])}
  return sorted(runs, key=lambda r: (order.get((r["table"], r["row"]), len(order)), r["seed"]))


def write_outputs(output_dir: str) -> dict[str, Any]:
  """results.json from the finished runs, then table.md and the plots from it."""
  results_path = os.path.join(output_dir, "results.json")
  _write_json(results_path, {"runs": collect(output_dir)})
  table = report.write_table(results_path, os.path.join(output_dir, "table.md"))
  made = plots.plot_results(results_path, output_dir)
  made += analysis.plot_learned_positions(results_path, output_dir)
  return {"results": results_path, "table": table, "plots": made}


def run_table(table: str, *, task: str, seeds: Sequence[int], output_dir: str,
              rows: Sequence[str] | None = None,
              overrides: dict[str, Any] | None = None) -> dict[str, Any]:
  """Trains and evaluates every (row, seed) of a table not finished yet in `output_dir`.

  Args:
    table: a name of `TABLES`.
    task: synthetic | multi30k | wmt14.
    seeds: the seeds to run each row with.
    output_dir: where runs, results.json, table.md and plots go (resumable).
    rows: a subset of the table's rows (default all).
    overrides: dotted config fields to set on every run, e.g. {"train.num_steps": 100}.

  Returns:
    write_outputs()'s paths and the table markdown.

  Raises:
    ValueError: for an unknown table or row, or no seeds.
  """
  if table not in TABLES:
    raise ValueError(f"unknown table {table!r}; allowed: {', '.join(TABLES)}.")
  if not seeds:
    raise ValueError("no seeds to run: --seeds must be at least 1.")
  rows = list(rows or TABLES[table])
  for row in rows:
    if row not in TABLES[table]:
      raise ValueError(f"row {row!r} is not in table {table!r}; allowed: "
                       f"{', '.join(TABLES[table])}.")
  for row in rows:  # every config valid before any work
    config_validation.validate(run_config(row, seeds[0], task, overrides))
  for row in rows:
    for seed in seeds:
      workdir = os.path.join(output_dir, "runs", f"{table}-{row.replace('=', '')}-seed{seed}")
      if os.path.exists(os.path.join(workdir, "result.json")):
        print(f"relpos: {workdir} is finished; skipping it.", flush=True)
        continue
      print(f"relpos: training and evaluating {workdir}", flush=True)
      if run_one(table, row, seed, task, workdir, overrides) is None:
        logging.warning("Preempted during %s: its checkpoint is saved; rerun the same command "
                        "to resume.", workdir)
        return {**write_outputs(output_dir), "preempted": True}
      write_outputs(output_dir)
  return {**write_outputs(output_dir), "preempted": False}
