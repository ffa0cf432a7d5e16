r"""Prepares `bundle/` for `tools/gpu_job.py`, on a machine with a network and relpos installed.

  python -m tools.gpu_bundle --multi30k_dir=../shared/data/multi30k

1. `bundle/wheels`: a wheel of each package relpos needs that the GPU host's image lacks
   (IMAGE_LACKS), for its CPython 3.12 on x86-64 Linux, at the version installed here: one
   version of each, since two stop the install;
2. `bundle/data`: the Multi30K (en-de) and synthetic datasets of the table jobs' configs, with
   their SentencePiece tokenizers, so that the host neither downloads nor builds anything.

Rerunning it fetches the wheels again and keeps the prepared datasets. `bundle/` is ignored by
git; carry it to the host whole.
"""

import importlib.metadata
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence

from absl import app
from absl import flags

from relpos.data import pipeline
from relpos.experiments import tables
from tools import gpu_job

# Packages of requirements.txt, and what they need, that the host's image does not have.
IMAGE_LACKS = (
    "ml_collections",
    "grain",
    "tensorflow-datasets",
    "array_record",
    "tensorboardX",
    "importlib_resources",
    "portpicker",  # grain's
    "dm-tree",
    "immutabledict",
    "promise",
    "simple_parsing",
    "tensorflow-metadata",  # tfds's
    "termcolor",
    "toml",
    "docstring_parser",  # simple_parsing's
    "googleapis-common-protos",  # tensorflow-metadata's
    "sacremoses",  # relpos.scoring's (its own needs, click, joblib, regex, tqdm, are there)
)
# Packages of pyproject.toml's dependencies the image has (device KINDS.md, "Python packages
# already there", read 2026-11-17): with IMAGE_LACKS, every dependency is one or the other (a
# test holds it), so a new dependency cannot be left off the bundle unnoticed.
IMAGE_HAS = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "absl-py", "numpy",
             "sentencepiece", "sacrebleu", "matplotlib", "scipy", "tqdm")
SOURCE_ONLY = ("promise",)  # published as source alone: built here (pure Python)
PYTHON_VERSION = "3.12"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64")

_MULTI30K_DIR = flags.DEFINE_string("multi30k_dir", None, "Folder of the raw Multi30K .gz files.",
                                    required=True)


def download_wheels(directory: str) -> None:
  """Fetches the IMAGE_LACKS wheels, at the versions installed here, into `directory` (emptied
  first, so that it holds one version of each)."""
  shutil.rmtree(directory, ignore_errors=True)
  os.makedirs(directory)
  pip = [sys.executable, "-m", "pip"]
  for name in IMAGE_LACKS:
    requirement = f"{name}=={importlib.metadata.version(name)}"
    if name in SOURCE_ONLY:
      command = [*pip, "wheel", "-q", "--no-deps", "-w", directory, requirement]
    else:
      command = [
          *pip, "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
          PYTHON_VERSION, "--implementation", "cp", *(f"--platform={p}" for p in PLATFORMS), "-d",
          directory, requirement
      ]
    subprocess.run(command, check=True)


def prepare_data(directory: str, multi30k_dir: str) -> None:
  """Prepares the datasets and tokenizers of the table jobs' tasks in `directory`."""
  for task in gpu_job.TASKS:
    config = tables.task_config(task)
    config.task.tfds_data_dir = directory
    if config.task.name == "multi30k":
      config.task.manual_dir = multi30k_dir
    pipeline.get_task(config.task)


def size_mib(path: str) -> float:
  """Bytes of the files under `path`, in MiB."""
  return sum(
      os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files) / 2**20


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {list(argv[1:])}")
  download_wheels(gpu_job.WHEELS_DIR)
  prepare_data(gpu_job.DATA_DIR, _MULTI30K_DIR.value)
  for path in (gpu_job.WHEELS_DIR, gpu_job.DATA_DIR, gpu_job.BUNDLE_DIR):
    print(f"{os.path.relpath(path, gpu_job.ROOT)}: {size_mib(path):.1f} MiB")


if __name__ == "__main__":
  app.run(main)
