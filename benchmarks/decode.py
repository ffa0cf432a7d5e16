"""Decoding speed: sentences per second of beam search (beam 4) and greedy search, with the
decode cache and without it (the decoder rerun over the whole output buffer at every step).

Models are freshly initialized with the task's shapes; eos is disabled (`eos_id=-1`), so every
search runs all `OUTPUT_LENGTH` steps and the work is the same for every variant and mode. The
cached and uncached searches are checked to return the same tokens before timing.
"""
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from benchmarks import common
from configs import ablation
from relpos import run_config
from relpos import decode
from relpos import model as model_lib

OUTPUT_LENGTH = 64
SOURCE_LENGTH = 24
SENTENCES = 16
VARIANTS = ("abs", "rel_kv", "t5", "rope", "alibi")
QUICK_VARIANTS = ("abs", "rel_kv")
TASKS = ("synthetic", "multi30k")
QUICK_TASKS = ("synthetic",)
SEARCHES = {"beam4": 4, "greedy": 1}
NO_EOS = -1  # never produced: every hypothesis runs to OUTPUT_LENGTH


def _model(row: str, task: str) -> model_lib.Transformer:
  config = ablation.get_config(f"{row},{task}")
  return model_lib.Transformer(run_config.validate(config).model, rngs=nnx.Rngs(0))


def _sources(vocab_size: int) -> jax.Array:
  rng = np.random.default_rng(0)
  return jnp.asarray(rng.integers(3, vocab_size, (SENTENCES, SOURCE_LENGTH)), jnp.int32)


def run_task(task: str, *, variants: tuple[str, ...], rounds: int) -> list[dict[str, Any]]:
  """Times every (variant, search, cache) of one task's model; returns one record each."""
  calls, records = {}, []
  for row in variants:
    model = _model(row, task)
    sources = _sources(model.config.vocab_size)
    for search, beam_size in SEARCHES.items():
      outputs = {}
      for use_cache in (True, False):
        call = functools.partial(decode.translate, model, sources, beam_size=beam_size,
                                 max_decode_len=OUTPUT_LENGTH, eos_id=NO_EOS, use_cache=use_cache)
        outputs[use_cache] = np.asarray(call())  # compiles
        calls[(row, search, use_cache)] = call
      if not np.array_equal(outputs[True], outputs[False]):
        raise AssertionError(f"decode {task}/{row}/{search}: cached and uncached searches "
                             "return different tokens.")
  common.progress(f"decode {task}: timing {len(calls)} searches")
  seconds = common.interleaved_medians(calls, rounds=rounds)
  for (row, search, use_cache), value in seconds.items():
    if not use_cache:
      continue
    uncached = seconds[(row, search, False)]
    records.append({
        "task": task, "variant": row, "search": search, "sentences": SENTENCES,
        "output_length": OUTPUT_LENGTH, "cached_seconds": value, "uncached_seconds": uncached,
        "cached_sentences_per_second": SENTENCES / value,
        "uncached_sentences_per_second": SENTENCES / uncached, "cache_speedup": uncached / value
    })
  return records


def run(*, quick: bool = False, rounds: int | None = None) -> dict[str, Any]:
  """Decoding benchmark of the synthetic and Multi30K models (quick: synthetic); see `run_task`."""
  variants = QUICK_VARIANTS if quick else VARIANTS
  records = []
  for task in QUICK_TASKS if quick else TASKS:
    records += run_task(task, variants=variants, rounds=rounds or (2 if quick else 3))
  return {
      "records": records, "sentences": SENTENCES, "source_length": SOURCE_LENGTH,
      "output_length": OUTPUT_LENGTH
  }
