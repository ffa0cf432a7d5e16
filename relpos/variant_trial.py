"""A trial of a position variant of the user's own, before a program does any work.

A variant other than relpos's own (`variants.BUILT_IN`; registered by `--import`) runs once
under `jax.eval_shape` on a tiny batch, as training and cached decoding call it, so that code
that raises, terms of the wrong shape, or a layer count unlike the model's, stop a program with
one line naming the variant and its file. Then a small model of it (the run's variant and its
fields; width 8 a head, one layer a stack, float32) runs on two sentence pairs, and must keep
the two contracts the built-in variants are tested for (tests/test_model.py, with the same
functions): cached decoding of 20 tokens into a cache of model.max_len slots equals the
teacher-forced pass (`cached_and_full_logits`), and a packed batch equals its sentences alone
(`packed_and_alone_logits`). A variant that reads `jnp.arange` instead of the positions it is
given, one row's positions for the whole batch, or the key length, fails one of them. Before
them, every array the model holds must be a parameter or random state (`_state_not_kept`), and
after them, the statistics its `add_statistics` stores after training must be JSON, and the
variant must add position information (`_adds_no_position_information`).
"""
import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from relpos import attention_statistics
from relpos import model as model_lib
from relpos import user_modules
from relpos import variants
from relpos.model_config import TransformerConfig

# Two source / target pairs (ids below 12; 0 pads, 1 ends); row 0 pads inputs and targets.
INPUTS = np.array([[3, 4, 5, 6, 1, 0], [7, 8, 9, 10, 11, 1]], np.int32)
TARGETS = np.array([[5, 6, 7, 1, 0], [9, 3, 4, 5, 1]], np.int32)
# Targets of 20 and 14 tokens for the trial's cached decoding: a variant that clips, buckets or
# scales by distance must agree with the full pass past the first few positions too.
LONG_TARGETS = np.array([[(3 + 5 * i) % 9 + 3 for i in range(19)] + [1],
                         [(4 + 7 * i) % 9 + 3 for i in range(13)] + [1] + [0] * 6], np.int32)
# How far the numeric trial's logits may differ (float32, a model of width 8 a head).
TRIAL_ATOL = 1e-4


def _trial_pass(model_config: TransformerConfig) -> tuple[jax.Array, jax.Array]:
  """Builds the model and runs it as training and decoding do, on a batch of num_heads + 1
  sources of 3 tokens and targets of 4 with positions for every row (a batch size unlike the
  head count, so that a term missing its head axis cannot broadcast as if it had one): the
  logits of a training pass and of one cached decode step."""
  model = model_lib.build_model(model_config, 0)
  batch = model_config.num_heads + 1
  inputs, targets = jnp.ones((batch, 3), jnp.int32), jnp.ones((batch, 4), jnp.int32)
  # Positions of every row, as packed training gives them (unpacked, they are [1, length]).
  logits = model(inputs, targets, inputs_positions=jnp.broadcast_to(jnp.arange(3), (batch, 3)),
                 targets_positions=jnp.broadcast_to(jnp.arange(4), (batch, 4)), deterministic=False)
  cache = model.init_cache(batch, min(4, model_config.max_len))
  step_logits, _ = model.decode_step(model.encode(inputs), inputs, targets[:, 0], 1, cache)
  return logits, step_logits


@nnx.jit
def _decode_step(model: model_lib.Transformer, encoded: jax.Array, inputs: jax.Array,
                 tokens: jax.Array, step: jax.Array, cache: model_lib.DecodeCache):
  """`model.decode_step`, compiled once for every step (as beam search runs it: the step
  traced), not run op by op (5.2 s -> 0.7 s for the five steps of TARGETS on 2 cores)."""
  return model.decode_step(encoded, inputs, tokens, step, cache)


@nnx.jit
def _forward(model: model_lib.Transformer, inputs: jax.Array, targets: jax.Array,
             **positions_and_segments: jax.Array) -> jax.Array:
  """`model(...)` (teacher-forced, deterministic), compiled: the trial's passes run as one
  program each, not op by op (on 2 cores the trial of examples/kerple.py took 15 s, most of it
  compiling about 200 single operations)."""
  return model(inputs, targets, **positions_and_segments)


@nnx.jit
def _encode(model: model_lib.Transformer, inputs: jax.Array) -> jax.Array:
  """`model.encode(inputs)`, compiled (as `_forward`)."""
  return model.encode(inputs)


def cached_and_full_logits(model: model_lib.Transformer, *, compiled: bool = True,
                           targets: np.ndarray = TARGETS) -> tuple[np.ndarray, np.ndarray]:
  """(logits of cached decoding, one target token a step; logits of the full teacher-forced
  pass) of `targets` (TARGETS, or LONG_TARGETS) given INPUTS, each [real target tokens,
  vocab]. `compiled`: the steps run compiled (`_decode_step`), else op by op as the full pass
  runs (the same arithmetic, bit for bit in bfloat16)."""
  decode_step = _decode_step if compiled else type(model).decode_step
  forward = _forward if compiled else type(model).__call__
  encode = _encode if compiled else type(model).encode
  full = forward(model, INPUTS, targets)
  encoded = encode(model, INPUTS)
  # As long as decoding's longest (model.max_len): the slots past the targets must stay masked,
  # and no term may depend on the cache's length, which the full pass does not have.
  cache = model.init_cache(2, model.config.max_len)
  previous = jnp.pad(targets, ((0, 0), (1, 0)))[:, :-1]
  steps = []
  for step in range(targets.shape[1]):
    logits, cache = decode_step(model, encoded, INPUTS, previous[:, step], jnp.int32(step), cache)
    steps.append(logits)
  real = targets != 0  # padded target positions see padding, unlike decoding.
  return np.stack(steps, 1)[real], np.asarray(full)[real]


def pack(rows: list[list[np.ndarray]], length: int) -> tuple[np.ndarray, ...]:
  """Packs each row's sentences: (tokens, positions, segment ids), each int32 [rows, length]."""
  tokens, positions, segments = (np.zeros((len(rows), length), np.int32) for _ in range(3))
  for row, sentences in enumerate(rows):
    start = 0
    for segment, sentence in enumerate(sentences, 1):
      end = start + len(sentence)
      tokens[row, start:end], positions[row, start:end] = sentence, np.arange(len(sentence))
      segments[row, start:end] = segment
      start = end
  return tokens, positions, segments


def packed_and_alone_logits(model: model_lib.Transformer) -> tuple[np.ndarray, np.ndarray]:
  """(logits of two pairs packed into each row, in both orders; the same pairs' logits each
  alone in its row), each [target tokens of both rows, vocab], aligned."""
  sources = [np.array([3, 1]), np.array([5, 6, 1])]
  targets = [np.array([8, 9, 1]), np.array([10, 1])]
  # Row 0 packs pairs (0, 1), row 1 packs (1, 0).
  inputs, inputs_positions, inputs_segmentation = pack([sources, sources[::-1]], 6)
  packed_targets, targets_positions, targets_segmentation = pack([targets, targets[::-1]], 5)
  packed = np.asarray(
      _forward(model, inputs, packed_targets, inputs_positions=inputs_positions,
               targets_positions=targets_positions, inputs_segmentation=inputs_segmentation,
               targets_segmentation=targets_segmentation))
  alone = np.asarray(
      _forward(model,
               pack([[s] for s in sources], 6)[0],
               pack([[t] for t in targets], 5)[0]))
  packed_rows, alone_rows = [], []
  for row, order in enumerate([(0, 1), (1, 0)]):
    start = 0
    for pair in order:
      length = len(targets[pair])
      packed_rows.append(packed[row, start:start + length])
      alone_rows.append(alone[pair, :length])
      start += length
  return np.concatenate(packed_rows), np.concatenate(alone_rows)


def _trial_model(model_config: TransformerConfig) -> model_lib.Transformer:
  """A small float32 model of `model_config`'s variant and its fields (width 8 a head, one
  layer a stack, no dropout), or, where the variant's own rules need the run's sizes (a field
  bounded by the layer count), one of those sizes."""
  exact = dict(dtype="float32", dropout_rate=0.0, attention_dropout_rate=0.0)
  width = 8 * model_config.num_heads
  try:
    small = dataclasses.replace(model_config, emb_dim=width, qkv_dim=width, mlp_dim=2 * width,
                                num_encoder_layers=1, num_decoder_layers=1, **exact)
  except ValueError:  # the sizes the trial chose are not the user's to be told about
    small = dataclasses.replace(model_config, **exact)
  return model_lib.build_model(small, 0)


def _adds_no_position_information(model: model_lib.Transformer) -> bool:
  """Whether no stack has a position embedding and no self-attention layer a position module
  whose class overrides `queries_and_keys` or `terms`: a variant whose methods never run
  (misspelled) trains a model without positions, silently. (A variant with positions in one
  stack alone, the decoder's say, adds them.)"""
  for _, module in nnx.iter_modules(model):
    if getattr(module, "position_embedding", None) is not None:
      return False
    if isinstance(module, variants.AttentionPosition) and any(
        getattr(type(module), method) is not getattr(variants.AttentionPosition, method)
        for method in ("queries_and_keys", "terms")):
      return False
  return True


def _state_not_kept(model: model_lib.Transformer) -> str | None:
  """The path of a value of the model that is neither a parameter (`nnx.Param`) nor random
  state, which checkpoints, the train step and evaluation leave out (`model.split_model`),
  e.g. "encoder/layers/0/self_attention/position/slope"; None when there is none."""
  for path, _ in nnx.to_flat_state(nnx.state(model, nnx.Not(nnx.Any(nnx.Param, nnx.RngState)))):
    return "/".join(map(str, path))
  return None


def _numeric_problem(model_config: TransformerConfig) -> str | None:
  """What `_trial_model` does against the two contracts, or what its `add_statistics` stores
  that a result.json cannot hold; None when all is well."""
  model = _trial_model(model_config)
  if (path := _state_not_kept(model)) is not None:
    return (f"{path} is neither an nnx.Param nor random state, so checkpoints and the train "
            "step would not hold it: declare a learned value as nnx.Param, and compute a fixed "
            "one in terms (or keep it as a plain Python number)")
  for what, (got, want), hint in (
      ("cached decoding differs from the teacher-forced pass",
       cached_and_full_logits(model, targets=LONG_TARGETS),
       "a decode step must use the query position it is given, and no term may depend on the "
       "cache's length or on its slots past the step"),
      ("a packed batch differs from its sentences alone", packed_and_alone_logits(model),
       "terms must come from each row's own positions, which restart per packed sentence"),
  ):
    difference = float(np.abs(got - want).max())
    if not difference <= TRIAL_ATOL:
      return f"{what} by up to {difference:.2g} in logits ({hint})"
  try:
    json.dumps(attention_statistics.position_statistics(model, INPUTS))
  except TypeError as e:  # stored after training, in result.json
    return f"add_statistics stores what JSON cannot hold ({e}; store lists and numbers)"
  if _adds_no_position_information(model):
    return ("it adds no position information: neither stack gets a position embedding or a "
            "self-attention module that overrides terms or queries_and_keys (a method name "
            "misspelled? AttentionPosition.terms or .queries_and_keys, Variant.embedding or "
            ".self_attention)")
  return None


def check_variant(model_config: TransformerConfig) -> None:
  """Builds the model and runs its position variant in a trial of `_trial_pass` under
  `jax.eval_shape` (shapes only: no parameters made, nothing computed), then a small model of
  it against the contracts of cached decoding and packing (`_numeric_problem`), so that a
  variant of the user's own (`--import`) whose code raises, whose terms have the wrong shape,
  or that breaks either contract, stops a program before it does any work or writes any file.

  The built-in variants (`variants.BUILT_IN`) are tested instead and skip the trial.

  Raises:
    ValueError: the trial failed, naming the variant, its module and the first line of the
      error (e.g. the bias shape returned and the one expected).
  """
  variant = variants.get(model_config.position)
  if variant.name in variants.BUILT_IN:
    return
  # By value, as JSON: a variant's field may hold a list, which a dataclass cannot hash.
  tried = (variant, json.dumps(dataclasses.asdict(model_config), sort_keys=True, default=repr))
  if tried not in _PASSED:
    _check_plug_in(model_config, variant)
    _PASSED.add(tried)


# (variant class, config as JSON) of the trials passed in this process: each runs once.
_PASSED: set[tuple[type[variants.Variant], str]] = set()


def _check_plug_in(model_config: TransformerConfig, variant: type[variants.Variant]) -> None:
  """`check_variant` of a variant registered outside relpos."""
  try:
    jax.eval_shape(functools.partial(_trial_pass, model_config))
    problem = _numeric_problem(model_config)
  except Exception as e:  # the user's code: any error is theirs, named in one line
    cause = (str(e).strip().splitlines() or [""])[0]
    cause = cause if isinstance(e, ValueError) else f"{type(e).__name__}: {cause}"
    raise ValueError(f"position variant {variant.name!r} ({variants.origin(variant)}) fails on "
                     f"a trial batch, before any work"
                     f"{user_modules.line_in(e, variants.origin(variant))}: "
                     f"{cause.rstrip('.')}.") from e
  if problem:
    raise ValueError(f"position variant {variant.name!r} ({variants.origin(variant)}) fails its "
                     f"trial on two sentence pairs, before any work: {problem}.")
