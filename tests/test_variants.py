"""Tests for relpos.variants: the registry, a variant defined here (registered, trained, decoded
with a cache), and a variant from the user's own file brought in by --import (train.py, eval.py,
the experiments CLI), plus the worked example of docs/api.md; and the length-extrapolation variants
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
from relpos import attention_statistics
from relpos import fields
from relpos import model as model_lib
from relpos import model_config
from relpos import positions as positions_lib
from relpos import variants
from test_model import ATOL, INPUTS, VOCAB, cached_and_full_logits, model_fields
from test_steps import _random_batch, initial_params, updates_on_one_batch

ROOT = pathlib.Path(__file__).resolve().parents[1]
KERPLE = ROOT / "examples" / "kerple.py"
BUILT_IN = ("none", "absolute", "relative", "t5", "rope", "alibi", "fire", "shape", "randomized")


class DistanceBias(variants.AttentionPosition):
  """A learned scalar per head for each distance |j - i| clipped to `window`."""
  def __init__(self, num_heads: int, window: int, *, rngs: nnx.Rngs):
    self.window = window
    self.table = nnx.Param(jax.random.normal(rngs.params(), (window + 1, num_heads)))

  def terms(self, query_positions, key_positions):
    distance = jnp.abs(key_positions[..., None, :] - query_positions[..., :, None])
    bias = self.table[...][jnp.minimum(distance, self.window)]  # [b, q, k, heads]
    return variants.AttentionTerms(bias=jnp.moveaxis(bias, -1, 1))

  def add_statistics(self, statistics, query, valid):
    statistics.setdefault("distance_bias", np.asarray(self.table[...]).tolist())
    statistics.setdefault("query_shapes", []).append([*query.shape, *valid.shape])


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
def fixture_registered(variant_registry):  # pylint: disable=unused-argument
  """DistanceBiasVariant registered as 'distance_bias' for one test (the registry restored
  after it)."""
  variants.register("distance_bias")(DistanceBiasVariant)


def test_built_in_variants_are_registered_in_order():
  assert variants.names()[:len(BUILT_IN)] == BUILT_IN
  assert variants.get("relative").name == "relative"
  assert "max_relative_position" in variants.all_fields()


def test_unknown_variant_lists_the_registered_ones():
  with pytest.raises(
      ValueError, match=r"unknown position variant 'nope'; registered: none, "
      r"absolute, relative, t5, rope, alibi.*--import"):
    variants.get("nope")


def test_register_refuses_a_taken_name_or_field(registered):
  class Other(variants.Variant):
    fields = {"distance_window": fields.Field(1, fields.integer(0))}

  with pytest.raises(ValueError, match="'relative' is already registered"):
    variants.register("relative")(Other)
  with pytest.raises(
      ValueError, match="field model.distance_window is already a field of "
      "variant 'distance_bias'"):
    variants.register("other")(Other)
  with pytest.raises(ValueError, match="not a relpos.variants.Variant subclass"):
    variants.register("plain")(dict)

  class DocOnly(variants.Variant):
    fields = {"window": "the largest distance"}  # a doc where the Field belongs

  with pytest.raises(
      ValueError, match=r"^variant 'doc_only': fields\['window'\] is 'the largest distance', "
      r"not a relpos.fields.Field\(default, rule, doc\)\.$"):
    variants.register("doc_only")(DocOnly)


@pytest.mark.parametrize("name", ["k=3", "my-variant", "a,b", "x/y", ""])
def test_register_refuses_a_name_that_is_not_a_row_name(name):
  """"k=3" ran in place of the k sweep's row k=3 under its name; "," splits --rows; "/" and
  "-" break the runs' folder names."""
  with pytest.raises(
      ValueError, match=r"^position variant name .*: use letters, digits and "
      r"underscores only \(it names a table row and its runs' folders\)\.$"):
    variants.register(name)(variants.Variant)


def test_register_refuses_a_built_in_name_for_a_class_of_another_module(registered):
  """A class named like the built-in one replaced it silently: the row `rope` ran the user's."""
  class Rope(variants.Variant):
    pass

  Rope.__qualname__ = variants.get("rope").__qualname__
  with pytest.raises(ValueError, match=r"'rope' is already registered \(relpos\.variants\.rope\."):
    variants.register("rope")(Rope)
  assert variants.get("rope").__module__ == "relpos.variants.rope"
  variants.register("distance_bias")(DistanceBiasVariant)  # the same class again: in its place
  assert variants.get("distance_bias") is DistanceBiasVariant


@pytest.mark.parametrize("name", ["num_heads", "head_dim", "vocab_size"])
def test_a_variant_field_named_like_the_transformers_own_is_refused(variant_registry, name):  # pylint: disable=unused-argument
  """`num_heads` changed the default of every row; `head_dim` read back the architecture's."""
  class Clash(variants.Variant):
    fields = {name: fields.Field(8, fields.integer(1), "clashes")}

  variants.register("clash")(Clash)
  with pytest.raises(
      ValueError, match=rf"^position variant 'clash' \(.*test_variants.py\) declares field "
      rf"model\.{name}, which is the Transformer's own; give it a name of the variant's "
      rf"\(e\.g\. clash_{name}\)\.$"):
    model_config.default_config()


def test_a_check_that_fails_otherwise_than_by_value_error_is_named_in_one_line(variant_registry):  # pylint: disable=unused-argument
  class InstanceCheck(variants.Variant):
    def check(self, config):  # not a classmethod
      pass

  variants.register("instance_check")(InstanceCheck)
  with pytest.raises(
      ValueError, match=r"^position variant 'instance_check' \(.*test_variants.py\): its "
      r"check\(config\) failed \(TypeError: .*\); check is a classmethod"):
    model_config.TransformerConfig.from_config(model_fields(position="instance_check"), VOCAB)


def _model(**overrides) -> model_lib.Transformer:
  config = model_fields(**overrides)
  return model_lib.Transformer(model_config.TransformerConfig.from_config(config, VOCAB),
                               rngs=nnx.Rngs(0))


def test_a_variant_defined_here_is_configured_validated_and_shared(registered):
  assert "distance_bias" in variants.names()
  assert model_config.default_config().distance_window == 3
  with pytest.raises(ValueError, match=r"model\.distance_window=-1.*integer >= 0"):
    _model(position="distance_bias", distance_window=-1)
  model = _model(position="distance_bias", distance_window=2)
  layers = [*model.encoder.layers, *model.decoder.layers]
  assert all(layer.self_attention.position is layers[0].self_attention.position for layer in layers)
  tables = [v for path, v in nnx.state(model, nnx.Param).flat_state() if path[-1] == "table"]
  assert [t[...].shape for t in tables] == [(3, 2)]  # one table, counted once


def test_a_config_built_before_the_variant_was_registered_says_so(variant_registry, caplog):
  """A config built in Python before the module registering its variant was imported lacks the
  variant's fields: the warning names that cause beside an old config's, and the model builds."""
  config = model_fields(position="none")
  variants.register("distance_bias")(DistanceBiasVariant)
  config["position"] = "distance_bias"
  model_config.TransformerConfig.from_config(config, VOCAB)
  assert ("config field model.distance_window of position variant 'distance_bias' (test_variants) "
          "is missing: the config was built before that module was imported, or written before "
          "the field existed; using 3.") in caplog.text


def test_a_variant_defined_here_reports_its_position_statistics(registered):
  model = _model(position="distance_bias")
  inputs = np.array([[3, 4, 5, 1, 0], [6, 1, 0, 0, 0]], np.int32)
  statistics = attention_statistics.position_statistics(model, inputs)
  table = model.encoder.layers[0].self_attention.position.table[...]
  assert statistics["distance_bias"] == np.asarray(table).tolist()
  head_dim = model.config.qkv_dim // model.config.num_heads
  assert statistics["query_shapes"] == [[2, 5, model.config.num_heads, head_dim, 2, 5]] * len(
      model.encoder.layers)


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
  assert json.loads(
      (workdir / "config.json").read_text())["model"]["kerple_shared_across_layers"] is True
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
      "importable: on PYTHONPATH, or give the path of its .py file)."
  ]
  broken = tmp_path / "broken.py"
  broken.write_text("import nothing_of_that_name\n")
  failed = _run("train.py", f"--import={broken}", f"--workdir={tmp_path / 'run'}")
  assert failed.returncode == 1
  assert failed.stderr.strip().splitlines()[-1].startswith(
      f"error: --import={broken}: importing it failed at broken.py:1: ModuleNotFoundError")
  leaving = tmp_path / "leaving.py"
  leaving.write_text("import sys\nsys.exit(3)\n")
  exited = _run("train.py", f"--import={leaving}", f"--workdir={tmp_path / 'run'}")
  assert exited.returncode == 1 and exited.stderr.strip().splitlines() == [
      f"error: --import={leaving} exited with status 3 while being imported."
  ]
  unknown = _run("train.py", "--config.model.position=kerple", f"--workdir={tmp_path / 'run'}")
  assert unknown.stderr.strip().splitlines()[-1].endswith(
      "(a variant of your own: --import=<its module>).")


WRONG_BIAS_MODULE = """
import jax.numpy as jnp
from relpos import variants

class WrongBias(variants.AttentionPosition):
  def terms(self, query_positions, key_positions):
    shape = (query_positions.shape[0], query_positions.shape[1], key_positions.shape[1], 5)
    return variants.AttentionTerms(bias=jnp.zeros(shape))

@variants.register("wrong_bias")
class WrongBiasVariant(variants.Variant):
  def self_attention(self, num_layers, *, causal, rngs):
    return [WrongBias() for _ in range(num_layers)]
"""


def test_import_of_a_variant_of_the_wrong_shape_is_one_line_and_writes_nothing(tmp_path):
  module = tmp_path / "wrong_bias.py"
  module.write_text(WRONG_BIAS_MODULE)
  workdir = tmp_path / "run"
  done = _run("train.py", f"--import={module}", "--config=configs/tiny.py",
              "--config.model.position=wrong_bias", f"--workdir={workdir}")
  assert done.returncode == 1 and done.stderr.strip().splitlines() == [
      f"error: position variant 'wrong_bias' ({module}) fails on a trial batch, before any "
      "work: bias has shape (3, 3, 3, 5); it must be [q_len, kv_len] or [batch or 1, heads "
      "or 1, q_len, kv_len] for [batch, heads, q_len, kv_len] = (3, 2, 3, 3)."
  ], done.stderr[-3000:]
  assert not workdir.exists()


def test_a_users_variant_is_a_row_of_the_ablation_table(tmp_path):
  listed = _run("-m", "relpos.experiments.run", f"--import={KERPLE}", "--list")
  assert ("table ablation: abs, rel_kv, rel_k, rel_v, none, t5, abs_rel_kv, rope, alibi "
          "(with --rows also: fire, shape, randomized, rel_kv_concat, kerple)") in listed.stdout
  kerple = tmp_path / "kerple.py"
  kerple.write_text(KERPLE.read_text())
  output_dir = tmp_path / "table"
  command = ("-m", "relpos.experiments.run", f"--import={kerple}", "--rows=kerple", "--task=tiny",
             "--config.train.num_steps=4", "--set=decode.length_diagnostics=False",
             "--config.train.eval_every_steps=4", "--config.train.checkpoint_every_steps=4",
             "--parallel=2", f"--output_dir={output_dir}")
  table = _run(*command)
  assert table.returncode == 0, table.stdout[-2000:] + table.stderr[-2000:]
  results = json.loads((output_dir / "results.json").read_text())
  assert [run["row"] for run in results["runs"]] == ["kerple"]
  assert results["runs"][0]["starts"][0]["variant_code"]["file"] == str(kerple)
  assert "| kerple |" in (output_dir / "table.md").read_text()
  # The variant's file edited since: its finished run is not reused without a word.
  kerple.write_text(kerple.read_text().replace("jnp.log1p(", "jnp.log1p(2 * "))
  again = _run(*command)
  assert again.returncode == 1 and again.stderr.count("\n") == 1, again.stderr[-2000:]
  assert (f"was made with the code of position variant 'kerple' ({kerple})='sha256:"
          in again.stderr) and "pass --retrain_changed" in again.stderr


def test_docs_worked_example_is_examples_kerple():
  api = (ROOT / "docs" / "api.md").read_text()
  section = api[api.index("## Adding a position variant"):]
  code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
  assert code == KERPLE.read_text()


# --- Length extrapolation variants: FIRE, SHAPE, randomized positions ----------------------


def test_fire_input_is_bounded_in_both_directions_and_the_papers_when_causal():
  model = _model(position="fire", fire_hidden=8)
  bias = model.encoder.layers[0].self_attention.position
  positions = jnp.arange(200)[None]
  normalized = np.asarray(bias.normalized_distances(positions, positions))[0]  # [q, k]
  assert normalized.min() == 0.0 and normalized.max() <= 1.0 + 1e-6
  # Where j <= i: the paper's psi(i - j) / psi(max(L, i)), c = 0.1 and L = 16 at start.
  i, j = np.meshgrid(np.arange(200), np.arange(200), indexing="ij")
  paper = np.log1p(0.1 * np.abs(i - j)) / np.log1p(0.1 * np.maximum(16, i))
  np.testing.assert_allclose(normalized[j <= i], paper[j <= i], rtol=1e-5)
  # Right of the query the paper's normalizer would exceed 1; here max(L, i, j) bounds it.
  assert paper[j > i].max() > 2.0
  np.testing.assert_allclose(normalized[0, 199], 1.0, rtol=1e-6)


def test_fire_bias_is_the_mlp_of_the_normalized_distance_and_direction():
  """The input x = psi(|i - j|) / psi(max(L, i, j)) computed here from the positions (not by
  `normalized_distances`, the code under test), with c = 0.5 and L = 3: positions 5 and 30
  pass L, so the normaliser differs by pair (from the positions, not the slots 0..3)."""
  model = _model(position="fire", fire_hidden=8)
  bias = model.encoder.layers[1].self_attention.position
  bias.log_c[...] = jnp.log(0.5)
  bias.threshold[...] = 3.0
  at = np.array([0, 1, 5, 30], np.float64)
  i, j = at[:, None], at[None, :]
  x = np.log1p(0.5 * np.abs(i - j)) / np.log1p(0.5 * np.maximum(3.0, np.maximum(i, j)))
  right = (j > i).astype(np.float64)
  features = np.stack([x, x * right], -1)  # [q, k, 2]
  w1, b1, w2, b2 = (np.asarray(param[...], np.float64)
                    for param in (bias.hidden.kernel, bias.hidden.bias, bias.out.kernel,
                                  bias.out.bias))
  expected = np.maximum(features @ w1 + b1, 0) @ w2 + b2  # [q, k, heads]
  positions = jnp.asarray(at[None], jnp.int32)
  np.testing.assert_allclose(
      bias(positions, positions)[0], np.moveaxis(expected, -1, 0), rtol=1e-5, atol=1e-6)


def test_fire_starts_at_the_configured_c_and_threshold():
  model = _model(position="fire", fire_hidden=8, fire_init_c=0.5, fire_init_threshold=4.0)
  biases = [
      layer.self_attention.position for layer in (*model.encoder.layers, *model.decoder.layers)
  ]
  assert len({id(bias) for bias in biases}) == 4  # one per self-attention layer
  for bias in biases:
    np.testing.assert_allclose(np.exp(bias.log_c[...]), 0.5, rtol=1e-6)
    assert float(bias.threshold[...]) == 4.0


def _rotate_half(x: np.ndarray, positions: np.ndarray, base: float) -> np.ndarray:
  """RoPE (Su et al.) in float64, rotate-half layout: channels c and c + d/2 of x [b, n, h, d]
  turned by positions [b, n] * base^(-2c/d)."""
  half = x.shape[-1] // 2
  angles = positions[..., None, None] * base**(-2.0 * np.arange(half) / x.shape[-1])
  first, second = x[..., :half], x[..., half:]
  return np.concatenate([
      first * np.cos(angles) - second * np.sin(angles),
      first * np.sin(angles) + second * np.cos(angles)
  ], axis=-1)


def test_rope_turns_queries_and_keys_at_the_configured_base():
  """model.rope_base=500 reaches every layer's rotation (at 10000 the outputs differ by 2.7).
  Tolerance 2e-5, the attention tests': float32 angles of positions up to 30 and the float32
  rotation, against float64 (2.5e-7 measured)."""
  model = _model(position="rope", rope_base=500.0)
  positions = np.array([[0, 3, 17, 30]])
  rng = np.random.default_rng(0)
  query, key = (rng.standard_normal((1, 4, 2, 8)).astype(np.float32) for _ in range(2))
  for layer in (*model.encoder.layers, *model.decoder.layers):
    rotated = layer.self_attention.position.queries_and_keys(jnp.asarray(query), jnp.asarray(key),
                                                             jnp.asarray(positions),
                                                             jnp.asarray(positions))
    for got, x in zip(rotated, (query, key)):
      np.testing.assert_allclose(got, _rotate_half(x.astype(np.float64), positions, 500.0),
                                 atol=2e-5)


def test_fire_learns_c_and_the_threshold():
  config = tiny.get_config()
  config.model.update(position="fire", fire_hidden=8)
  batch = _random_batch(np.random.default_rng(2), 8, 16, config.task.vocab_size)
  losses, state = updates_on_one_batch(config, batch, 4)
  assert losses[-1] < losses[0]

  def fire_leaves(params, name: str) -> list[float]:
    return [
        float(leaf)
        for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
        if jax.tree_util.keystr(path).endswith(f"['{name}']")
    ]

  layers = config.model.num_encoder_layers + config.model.num_decoder_layers
  initial = initial_params(config)
  for name in ("threshold", "log_c"):
    before, after = fire_leaves(initial, name), fire_leaves(state["params"], name)
    assert len(before) == len(after) == layers  # one per self-attention layer
    assert before == pytest.approx([{"threshold": 16.0, "log_c": np.log(0.1)}[name]] * layers)
    assert all(b != a for b, a in zip(before, after)), name  # each got a gradient


def _packed_positions() -> np.ndarray:
  """Two rows: segments of 3 and 4 tokens then padding; one segment of 6 then padding."""
  return np.array([[0, 1, 2, 0, 1, 2, 3, 0], [0, 1, 2, 3, 4, 5, 0, 0]], np.int32)


def _segments(positions: np.ndarray) -> list[tuple[int, int, int]]:
  """(row, start, end) of each segment longer than one token."""
  found = []
  for row, line in enumerate(positions):
    starts = list(np.flatnonzero(line == 0)) + [len(line)]
    found += [(row, a, b) for a, b in zip(starts, starts[1:]) if b - a > 1]
  return found


@pytest.mark.parametrize("variant", ["shape", "randomized"])
def test_stochastic_variants_evaluate_as_absolute(variant):
  def build(position):
    config = model_fields(position=position)
    return model_lib.build_model(model_config.TransformerConfig.from_config(config, VOCAB), 0)

  absolute, model = build("absolute"), build(variant)
  # The same parameters (the variant draws from the dropout stream, not the parameters') ...
  assert all(
      np.array_equal(a, b) for a, b in zip(jax.tree.leaves(nnx.state(absolute, nnx.Param)),
                                           jax.tree.leaves(nnx.state(model, nnx.Param))))
  # ... and at evaluation the same encodings: 0..n-1, no shift, no sampling.
  np.testing.assert_array_equal(model(INPUTS, INPUTS[:, :5]), absolute(INPUTS, INPUTS[:, :5]))


def test_shape_shifts_each_segment_by_one_offset_in_training():
  model = _model(position="shape", shape_max_shift=9)
  embedding = model.encoder.position_embedding
  positions = jnp.asarray(_packed_positions())
  table = np.asarray(embedding(jnp.arange(40)[None], deterministic=True))[0]  # [40, d]
  offsets = set()
  for _ in range(5):
    encoded = np.asarray(embedding(positions, deterministic=False))
    for row, start, end in _segments(np.asarray(positions)):
      # Which shifted position each token was encoded at.
      at = [int(np.argmin(np.abs(table - vector).sum(-1))) for vector in encoded[row, start:end]]
      offset = at[0]
      assert at == list(range(offset, offset + end - start)) and 0 <= offset <= 9
      np.testing.assert_allclose(encoded[row, start:end], table[at], atol=1e-6)
      offsets.add(offset)
  assert len(offsets) > 3  # drawn afresh per segment and call


def test_randomized_draws_sorted_positions_below_l_per_segment_in_training():
  model = _model(position="randomized", randomized_max_position=40)
  embedding = model.decoder.position_embedding
  positions = jnp.asarray(_packed_positions())
  table = np.asarray(embedding(jnp.arange(40)[None], deterministic=True))[0]
  drawn = []
  for _ in range(5):
    encoded = np.asarray(embedding(positions, deterministic=False))
    for row, start, end in _segments(np.asarray(positions)):
      at = [int(np.argmin(np.abs(table - vector).sum(-1))) for vector in encoded[row, start:end]]
      np.testing.assert_allclose(encoded[row, start:end], table[at], atol=1e-6)
      assert all(a < b for a, b in zip(at, at[1:])) and 0 <= at[0] and at[-1] < 40
      drawn.append(tuple(at))
  assert len(set(drawn)) > len(drawn) // 2 and max(max(d) for d in drawn) > 20


def test_randomized_evaluates_at_the_stride():
  model = _model(position="randomized", randomized_eval_stride=3)
  positions = jnp.arange(5)[None]
  np.testing.assert_array_equal(model.encoder.position_embedding(positions, deterministic=True),
                                positions_lib.sinusoidal_position_encoding(positions * 3, 16))


def test_randomized_warns_when_evaluation_positions_pass_l(caplog, monkeypatch):
  """Stride 6 and L = 256 (the length table's row) put position 43 at 258: no training
  position; a warning says so, once per process for those settings."""
  from relpos.variants import randomized  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(randomized, "_WARNED", set())
  for _ in range(2):
    _model(position="randomized", randomized_eval_stride=6, randomized_max_position=256,
           max_len=256)
  warned = [r.getMessage() for r in caplog.records if "randomized_eval_stride" in r.getMessage()]
  assert warned == [
      "model.randomized_eval_stride=6 puts evaluation position 43 at 258, past "
      "model.randomized_max_position=256: a sequence longer than 43 tokens (of up to "
      "model.max_len=256) is evaluated at positions training never draws."
  ]
  _model(position="randomized", randomized_eval_stride=1, randomized_max_position=256, max_len=256)
  assert len([r for r in caplog.records if "randomized_eval_stride" in r.getMessage()]) == 1


@pytest.mark.parametrize("variant", ["shape", "randomized"])
def test_stochastic_variants_train_and_draw_from_the_models_rng(variant):
  config = tiny.get_config()
  config.model.position = variant
  batch = _random_batch(np.random.default_rng(2), 8, 16, config.task.vocab_size)
  losses, _ = updates_on_one_batch(config, batch, 4)
  assert losses[-1] < losses[0]
  # Training draws from the model's dropout stream: two calls differ, evaluation does not.
  model = _model(position=variant, dropout_rate=0.0)
  first = model(INPUTS, INPUTS[:, :5], deterministic=False)
  assert np.abs(first - model(INPUTS, INPUTS[:, :5], deterministic=False)).max() > 1e-3
  np.testing.assert_array_equal(model(INPUTS, INPUTS[:, :5]), model(INPUTS, INPUTS[:, :5]))


def test_a_module_run_again_registers_its_variants_again(tmp_path, monkeypatch, variant_registry):  # pylint: disable=unused-argument
  """Two variants sharing a module-level Field: run again (a notebook cell, a re-import), the
  first met the stale sibling's Field object and was refused."""
  module = tmp_path / "twins.py"
  module.write_text("from relpos import fields, variants\n"
                    "SHARED = {'twin_width': fields.Field(4, fields.integer(1), 'a width')}\n"
                    "@variants.register('twin_a')\n"
                    "class TwinA(variants.Variant):\n  fields = SHARED\n"
                    "@variants.register('twin_b')\n"
                    "class TwinB(variants.Variant):\n  fields = SHARED\n")
  code = compile(module.read_text(), str(module), "exec")
  for _ in range(2):
    exec(code, {"__name__": "twins"})  # pylint: disable=exec-used
  assert variants.get("twin_a").fields["twin_width"] is variants.get("twin_b").fields["twin_width"]
