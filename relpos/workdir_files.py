"""The names of the files and folders of a run's workdir.

A workdir holds:

  config.json           the resolved config (data, never code)
  imports.json          the modules the run imported with --import (their variants), if any
  train.lock            held by the training process (relpos.locks)
  metrics.jsonl         train and validation records; tensorboard/ the same as events
  starts.jsonl          one line per start of the run: time, step, source commit, host, the
                        sha256 of its tokenizer (and of a user's position variant's file)
  checkpoints/<step>/   Orbax checkpoints (relpos.checkpoints); damaged_checkpoints/ the ones
                        training set aside
  eval/                 translations and scores: eval.py's, and a table's final evaluation's
"""

CONFIG_FILE = "config.json"
IMPORTS_FILE = "imports.json"
LOCK_FILE = "train.lock"
METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
CHECKPOINT_DIR = "checkpoints"
DAMAGED_DIR = "damaged_checkpoints"  # where training moves damaged checkpoints (never deleted)
EVAL_DIR = "eval"
