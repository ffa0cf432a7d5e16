"""WMT 2014 English-German: the TFDS catalog's `wmt14_translate/de-en`, the paper's data.

Reading a prepared copy (array_record) needs no TensorFlow. Preparing it from the raw WMT
archives does: TFDS extracts archives through `tf.io.gfile`. Prepare it once where TensorFlow
is installed, e.g.

  pip install tensorflow-cpu tensorflow-datasets==4.9.10
  tfds build wmt14_translate/de-en --file_format=array_record --data_dir=DIR

and point `task.tfds_data_dir` (or $RELPOS_DATA_DIR) at DIR; `load` also prepares it itself
when TensorFlow is importable.
"""

import importlib.util

import ml_collections
# Importing the module registers the catalog builder; it imports no TensorFlow.
from tensorflow_datasets.translate import wmt14 as tfds_wmt14

from relpos.data import datasets

LANGUAGES = ("de", "en")
CONFIG = "de-en"  # the catalog's builder config (both directions)
SPLITS = ("train", "validation", "test")  # newstest2013 is validation, newstest2014 test


def tensorflow_installed() -> bool:
  """Whether TensorFlow can be imported (needed to prepare WMT14 from its raw archives)."""
  return importlib.util.find_spec("tensorflow") is not None


def load(task_config: ml_collections.ConfigDict, root: str) -> datasets.PairDataset:
  """WMT14 for task.source_lang -> task.target_lang (en and de), prepared in `root`.

  Raises:
    ValueError: a language other than en or de.
    FileNotFoundError: the dataset is not prepared in `root` and TensorFlow is not installed.
  """
  for field in ("source_lang", "target_lang"):
    if task_config[field] not in LANGUAGES:
      raise ValueError(f"config field task.{field}={task_config[field]!r} is invalid: WMT14 "
                       f"(wmt14_translate/{CONFIG}) has {', '.join(LANGUAGES)}.")
  if task_config.source_lang == task_config.target_lang:
    raise ValueError(f"config fields task.source_lang and task.target_lang are both "
                     f"{task_config.source_lang!r}: a translation needs two languages.")

  def prepare_data(builder: tfds_wmt14.Wmt14Translate) -> None:
    if not tensorflow_installed():
      raise FileNotFoundError(  # the prepared data is missing: one line for the user
          f"wmt14_translate/{CONFIG} is not prepared in {root}, and preparing it from the raw "
          f"WMT archives needs TensorFlow. Run `tfds build wmt14_translate/{CONFIG} "
          f"--file_format={datasets.FILE_FORMAT} --data_dir={root}` where TensorFlow is "
          f"installed, or set task.tfds_data_dir to a folder holding it.")
    datasets.prepare(builder)

  builder = datasets.prepared(
      lambda: tfds_wmt14.Wmt14Translate(config=CONFIG, data_dir=root, file_format=datasets.
                                        FILE_FORMAT), prepare_data)
  return datasets.PairDataset(builder, SPLITS, source_key=task_config.source_lang,
                              target_key=task_config.target_lang)
