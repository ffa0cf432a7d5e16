"""Tests for relpos.variants: the registry, a variant defined here (registered, trained, decoded
with a cache), and a variant from the user's own file brought in by --import (train.py, eval.py,
the experiments CLI), plus the README's worked example; and the length-extrapolation variants
(FIRE, SHAPE, randomized positions)."""
import json
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import tiny
from relpos import fields
from relpos import model as model_lib
from relpos import variants
from relpos.variants import interface
from test_model import ATOL, INPUTS, TINY, VOCAB, cached_and_full_logits
from test_train import _random_batch, updates_on_one_batch

ROOT = pathlib.Path(__file__).resolve().parents[1]
KERPLE = ROOT / "examples" / "kerple.py"
BUILT_IN = ("none", "absolute", "relative", "t5", "rope", "alibi", "fire", "shape",
            "randomized")


class DistanceBias(variants.AttentionPosition):
  """A learned scalar per head for each distance |j - i| clipped to `window`."""

  def __init__(self, num_heads: int, window: int, *, rngs: nnx.Rngs):
    self.window = window
    self.table = nnx.Param(jax.random.normal(rngs.params(), (window + 1, num_heads)))

  def terms(self, query_positions, key_positions):
    distance = jnp.abs(key_positions[..., None, :] - query_positions[..., :, None])
    bias = self.table[...][jnp.minimum(distance, self.window)]  # [b, q, k, heads]
    return variants.AttentionTerms(bias=jnp.moveaxis(bias, -1, 1))


class DistanceBiasVariant(variants.Variant):
  """One DistanceBias shared by every self-attention layer of both stacks."""
  fields = {"distance_window": fields.Field(3, fields.integer(0), "the largest distance")}

  def __init__(self, config):
    super().__init__(config)
    self.shared = None

  def self_attention(self, num_layers, *, causal, rngs):
    if self.shared is None:
      self.shared = DistanceBias(self.config.num_heads, self.config.distance_window, rngs=rngs)
    return [self.shared] * num_layers


@pytest.fixture(name="registered")
def fixture_registered(monkeypatch):
  """DistanceBiasVariant registered as 'distance_bias' for one test (the registry restored
  after it)."""
  registry = dict(interface._REGISTRY)  # pylint: disable=protected-access
  monkeypatch.setattr(interface, "_REGISTRY", registry)
  variants.register("distance_bias")(DistanceBiasVariant)


def test_built_in_variants_are_registered_in_order():
  assert variants.names()[:len(BUILT_IN)] == BUILT_IN
  assert variants.get("relative").name == "relative"
  assert "max_relative_position" in variants.all_fields()


def test_unknown_variant_lists_the_registered_ones():
  with pytest.raises(ValueError, match=r"unknown position variant 'nope'; registered: none, "
                                       r"absolute, relative, t5, rope, alibi.*--import"):
    variants.get("nope")


def test_register_refuses_a_taken_name_or_field(registered):
  class Other(variants.Variant):
    fields = {"distance_window": fields.Field(1, fields.integer(0))}

  with pytest.raises(ValueError, match="'relative' is already registered"):
    variants.register("relative")(Other)
  with pytest.raises(ValueError, match="field model.distance_window is already a field of "
                                       "variant 'distance_bias'"):
    variants.register("other")(Other)
  with pytest.raises(ValueError, match="not a relpos.variants.Variant subclass"):
    variants.register("plain")(dict)


def _model(**overrides) -> model_lib.Transformer:
  config = {**model_lib.default_config().to_dict(), **TINY, **overrides}
  return model_lib.Transformer(model_lib.TransformerConfig.from_config(config, VOCAB),
                               rngs=nnx.Rngs(0))


def test_a_variant_defined_here_is_configured_validated_and_shared(registered):
  assert "distance_bias" in variants.names()
  assert model_lib.default_config().distance_window == 3
  with pytest.raises(ValueError, match=r"model\.distance_window=-1.*integer >= 0"):
    _model(position="distance_bias", distance_window=-1)
  model = _model(position="distance_bias", distance_window=2)
  layers = [*model.encoder.layers, *model.decoder.layers]
  assert all(layer.self_attention.position is layers[0].self_attention.position
             for layer in layers)
  tables = [v for path, v in nnx.state(model, nnx.Param).flat_state() if path[-1] == "table"]
  assert [t[...].shape for t in tables] == [(3, 2)]  # one table, counted once


def test_a_variant_defined_here_decodes_with_a_cache_as_in_the_full_pass(registered):
  model = _model(position="distance_bias")
  np.testing.assert_allclose(*cached_and_full_logits(model), atol=ATOL)
  # Relative: the same sentence read from position 5 on encodes the same.
  positions = np.arange(INPUTS.shape[1])[None] + np.zeros_like(INPUTS)
  np.testing.assert_allclose(model.encode(INPUTS, inputs_positions=positions + 5),
                             model.encode(INPUTS), atol=ATOL)


def test_a_variant_defined_here_trains(registered):
  config = tiny.get_config()
  config.model.position = "distance_bias"
  batch = _random_batch(np.random.default_rng(2), 8, 16, config.task.vocab_size)
  losses, state = updates_on_one_batch(config, batch, 6)
  assert losses[-1] < losses[0]
  paths = [path for path, _ in jax.tree_util.tree_flatten_with_path(state["params"])[0]]
  assert sum(path[-1].key == "table" for path in paths) == 1  # the shared table, trained


def _run(*args: str, cwd: pathlib.Path = ROOT) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                        timeout=600, check=False)


TINY_KERPLE = ("--config=configs/tiny.py", "--config.model.position=kerple",
               "--config.model.kerple_shared_across_layers=True", "--config.train.num_steps=4",
               "--config.train.eval_every_steps=4", "--config.train.checkpoint_every_steps=4")


def test_import_brings_a_users_variant_into_train_and_eval(tmp_path):
  workdir = tmp_path / "kerple"
  trained = _run("train.py", f"--import={KERPLE}", *TINY_KERPLE, f"--workdir={workdir}")
  assert trained.returncode == 0, trained.stderr[-2000:]
  assert json.loads(trained.stdout.strip().splitlines()[-1])["step"] == 4
  assert json.loads((workdir / "imports.json").read_text()) == [str(KERPLE)]
  assert json.loads((workdir / "config.json").read_text())["model"][
      "kerple_shared_across_layers"] is True
  # eval.py imports what the run recorded, without being told.
  scored = _run("eval.py", f"--workdir={workdir}", "--split=validation", "--beam_size=1",
                f"--output_dir={tmp_path / 'eval'}")
  assert scored.returncode == 0, scored.stderr[-2000:]
  assert json.loads(scored.stdout)["step"] == 4
  # Code found inside the workdir is never run.
  planted = workdir / "planted.py"
  planted.write_text("raise SystemExit('ran code from the workdir')\n")
  (workdir / "imports.json").write_text(json.dumps([str(planted)]))
  refused = _run("eval.py", f"--workdir={workdir}", "--split=validation")
  assert refused.returncode == 1
  assert re.search(r"planted\.py lies inside the workdir .*never run", refused.stderr)


def test_import_mistakes_are_one_line(tmp_path):
  missing = _run("train.py", "--import=no_such_module_here", f"--workdir={tmp_path}")
  assert missing.returncode == 1 and missing.stderr.strip().splitlines() == [
      "error: --import=no_such_module_here: no such module or .py file (a module must be "
      "importable: on PYTHONPATH, or give the path of its .py file)."]
  broken = tmp_path / "broken.py"
  broken.write_text("import nothing_of_that_name\n")
  failed = _run("train.py", f"--import={broken}", f"--workdir={tmp_path / 'run'}")
  assert failed.returncode == 1
  assert failed.stderr.strip().splitlines()[-1].startswith(
      f"error: --import={broken}: importing it failed: ModuleNotFoundError")
  unknown = _run("train.py", "--config.model.position=kerple", f"--workdir={tmp_path / 'run'}")
  assert unknown.stderr.strip().splitlines()[-1].endswith(
      "(a variant of your own: --import=<its module>).")


def test_a_users_variant_is_a_row_of_the_ablation_table(tmp_path):
  listed = _run("-m", "relpos.experiments.run", f"--import={KERPLE}", "--list")
  assert ("table ablation: abs, rel_kv, rel_k, rel_v, none, t5, abs_rel_kv, rope, alibi, fire, "
          "shape, randomized, kerple") in listed.stdout
  table = _run("-m", "relpos.experiments.run", f"--import={KERPLE}", "--rows=kerple",
               "--task=tiny", "--config.train.num_steps=4",
               "--config.train.eval_every_steps=4", "--config.train.checkpoint_every_steps=4",
               "--parallel=2", f"--output_dir={tmp_path}")
  assert table.returncode == 0, table.stdout[-2000:] + table.stderr[-2000:]
  results = json.loads((tmp_path / "results.json").read_text())
  assert [run["row"] for run in results["runs"]] == ["kerple"]
  assert "| kerple |" in (tmp_path / "table.md").read_text()


def test_readme_worked_example_is_examples_kerple():
  readme = (ROOT / "README.md").read_text()
  section = readme[readme.index("## Adding a position variant"):]
  code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
  assert code == KERPLE.read_text()
