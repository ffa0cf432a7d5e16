"""Evaluates a checkpoint: `python eval.py --workdir=runs/x --checkpoint=best --split=test`.

Rebuilds the model from `<workdir>/config.json` (never executing code from the workdir; the
modules the run imported with --import, recorded in `<workdir>/imports.json`, are imported),
translates a split (--split) or a file of source sentences (--input, with --reference for
scores) with beam search, and writes the translations and a JSON of sacreBLEU (score and
signature), chrF, the number of sentences and the checkpoint step to --output_dir
(default `<workdir>/eval`), named after what was evaluated
(`relpos.evaluation_files.output_name`: split or input file, checkpoint choice, step, beam,
alpha) and never replacing another evaluation's outputs. The JSON is also printed.
"""
import json

from absl import app
from absl import flags

from relpos import cli
from relpos import evaluate

_IMPORT = cli.define_import_flag()  # besides the modules the run recorded (imports.json)
_WORKDIR = flags.DEFINE_string("workdir", None, "Training workdir.", required=True)
_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", "latest", "latest, best, a step number, or average:N (the parameters of the "
    "last N checkpoints saved on schedule averaged).")
_SPLIT = flags.DEFINE_string("split", None, "Split of the run's task, e.g. validation or test.")
_INPUT = flags.DEFINE_string("input", None, "UTF-8 file of source sentences, one a line.")
_REFERENCE = flags.DEFINE_string("reference", None, "References for --input, one a line.")
_BEAM_SIZE = flags.DEFINE_integer("beam_size", None, "Overrides decode.beam_size of the run.")
_ALPHA = flags.DEFINE_float("alpha", None, "Overrides decode.alpha of the run.")
_MAX_DECODE_LEN = flags.DEFINE_integer(
    "max_decode_len", None, "Overrides decode.max_decode_len of the run: the most target "
    "tokens a translation may have (0: 2 x the batch's padded source length + 10, at most "
    "model.max_len).")
_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Default: <workdir>/eval.")
_MULTIHOST = cli.define_multihost_flag()
flags.adopt_module_key_flags(cli)  # --help lists --import and --multihost


def main(argv: list[str]) -> None:
  result = cli.run(
      argv, lambda: evaluate.evaluate_checkpoint(
          _WORKDIR.value, checkpoint=_CHECKPOINT.value, split=_SPLIT.value, input_file=_INPUT.value,
          reference_file=_REFERENCE.value, beam_size=_BEAM_SIZE.value, alpha=_ALPHA.value,
          max_decode_len=_MAX_DECODE_LEN.value, output_dir=_OUTPUT_DIR.value),
      multihost=_MULTIHOST.value)
  print(json.dumps(result, indent=2))


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
