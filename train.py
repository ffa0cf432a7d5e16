"""Trains a relpos model: `python train.py --config=configs/ablation.py:rel_kv --workdir=runs/x`.

Any config field can be overridden, e.g. `--config.model.max_relative_position=8`; a position
variant of your own is trained with `--import=my_variant.py --config.model.position=<its
name>`. Starting again with the same --workdir resumes from its latest checkpoint; SIGTERM
saves a checkpoint and exits with status 0. On several hosts pass --multihost
(see relpos.distributed.initialize).
"""
import json
import os

from absl import app
from absl import flags

from relpos import cli
from relpos import source_tree
from relpos import train

_IMPORT = cli.define_import_flag()  # first: its variants must exist when the config loads
_CONFIG = cli.define_config_flag(os.path.join(source_tree.ROOT, "configs", "default.py"))
_WORKDIR = flags.DEFINE_string("workdir", None, "Folder of the run (created or resumed).",
                               required=True)
_MULTIHOST = cli.define_multihost_flag()
flags.adopt_module_key_flags(cli)  # --help lists --config, --import, --multihost


def main(argv: list[str]) -> None:
  def work() -> dict:
    cli.check_model_overrides(_CONFIG)
    return train.train_and_evaluate(_CONFIG.value, _WORKDIR.value)

  print(json.dumps(cli.run(argv, work, multihost=_MULTIHOST.value)))


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
