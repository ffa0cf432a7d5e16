"""Default config: the synthetic translation task with a small model sized for 2 CPU cores.

Every field is declared once, with its default, rule and doc: `seed`, `task.*`, `train.*` and
`decode.*` in `relpos/run_config.py` (SECTIONS), the architecture's `model.*` fields on
`relpos.model_config.TransformerConfig`, each position variant's own (k, a^K / a^V switches, T5
buckets, ...) in its module of `relpos/variants/`. The default variant is
model.position = "relative" (Shaw et al., k = 16, a^K and a^V).

Every field can be overridden on the command line, e.g.
`--config.model.max_relative_position=8`. Validation happens once at start
(`relpos.run_config.validate`), naming the field and the allowed values.
"""
import ml_collections

from relpos import run_config


def get_config() -> ml_collections.ConfigDict:
  """Returns the default (synthetic task, CPU-sized, `rel_kv`) configuration."""
  return run_config.default_config()
