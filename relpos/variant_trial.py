"""A trial of a position variant of the user's own, before a program does any work.

A variant registered outside relpos (`--import`) runs once under `jax.eval_shape` on a tiny
batch, as training and cached decoding call it, so that code that raises, or terms of the
wrong shape, stop a program with one line naming the variant and its file.
"""
import functools
import sys

import jax
import jax.numpy as jnp

from relpos import model as model_lib
from relpos import variants
from relpos.model_config import TransformerConfig


def _trial_pass(model_config: TransformerConfig) -> tuple[jax.Array, jax.Array]:
  """Builds the model and runs it as training and decoding do, on a batch of 2 sources of 3
  tokens and targets of 4: the logits of a training pass and of one cached decode step."""
  model = model_lib.build_model(model_config, 0)
  inputs, targets = jnp.ones((2, 3), jnp.int32), jnp.ones((2, 4), jnp.int32)
  logits = model(inputs, targets, deterministic=False)
  cache = model.init_cache(2, min(4, model_config.max_len))
  step_logits, _ = model.decode_step(model.encode(inputs), inputs, targets[:, 0], 1, cache)
  return logits, step_logits


def _origin(variant: type[variants.Variant]) -> str:
  """Where a variant's code comes from: its module's file, else its module's name."""
  return getattr(sys.modules.get(variant.__module__), "__file__", None) or variant.__module__


def check_variant(model_config: TransformerConfig) -> None:
  """Builds the model and runs its position variant in a trial of `_trial_pass` under
  `jax.eval_shape` (shapes only: no parameters made, nothing computed), so that a variant of
  the user's own (`--import`) whose code raises, or whose terms have the wrong shape, stops a
  program before it does any work or writes any file.

  The built-in variants (of relpos itself) are tested instead and skip the trial.

  Raises:
    ValueError: the trial failed, naming the variant, its module and the first line of the
      error (e.g. the bias shape returned and the one expected).
  """
  variant = variants.get(model_config.position)
  if variant.__module__.split(".")[0] != "relpos":
    _check_plug_in(model_config, variant)


@functools.lru_cache(maxsize=16)
def _check_plug_in(model_config: TransformerConfig, variant: type[variants.Variant]) -> None:
  """`check_variant` of a variant registered outside relpos (once per config and class)."""
  try:
    jax.eval_shape(functools.partial(_trial_pass, model_config))
  except Exception as e:  # the user's code: any error is theirs, named in one line
    cause = (str(e).strip().splitlines() or [""])[0]
    cause = cause if isinstance(e, ValueError) else f"{type(e).__name__}: {cause}"
    raise ValueError(f"position variant {variant.name!r} ({_origin(variant)}) fails on a trial "
                     f"batch, before any work: {cause.rstrip('.')}.") from e
