"""Tests for benchmarks/: the variants they time compute the right thing, and the report.

The benchmarks themselves are not run here (minutes, not in CI); these check their building
blocks at tiny sizes.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import attention
from benchmarks import common
from benchmarks import decode
from benchmarks import profile
from benchmarks import run
from benchmarks import train_step
from relpos import train as train_lib


def test_attention_variants_match_their_references():
  errors = attention.check_variants()
  assert errors and max(errors.values()) < 1e-4, errors


def test_packed_batch_holds_whole_segments():
  batch = train_step.packed_batch(rows=3, length=40, vocab_size=50)
  assert set(batch) == set(train_lib.BATCH_KEYS)
  for side in ("inputs", "targets"):
    tokens, positions = batch[side], batch[f"{side}_position"]
    segments = batch[f"{side}_segmentation"]
    for row in range(3):
      for segment in set(segments[row][segments[row] > 0]):
        where = segments[row] == segment
        np.testing.assert_array_equal(positions[row][where], np.arange(where.sum()))
        assert tokens[row][where][-1] == train_step.EOS_ID and 3 <= where.sum() <= 20
      assert not tokens[row][segments[row] == 0].any()


def test_interleaved_medians_times_every_call():
  counts = {"a": 0, "b": 0}

  def call(name):
    counts[name] += 1

  seconds = common.interleaved_medians({n: (lambda n=n: call(n)) for n in counts}, rounds=3,
                                       warmup=1)
  assert counts == {"a": 4, "b": 4} and set(seconds) == {"a", "b"}


def test_decode_benchmark_compares_equal_searches(monkeypatch):
  monkeypatch.setattr(decode, "OUTPUT_LENGTH", 6)
  monkeypatch.setattr(decode, "SENTENCES", 2)
  monkeypatch.setattr(decode, "SOURCE_LENGTH", 5)
  records = decode.run_task("synthetic", variants=("rel_kv",), rounds=1)
  assert [(r["variant"], r["search"]) for r in records] == [("rel_kv", "beam4"),
                                                            ("rel_kv", "greedy")]
  for r in records:
    assert r["cache_speedup"] == pytest.approx(r["uncached_seconds"] / r["cached_seconds"])


def _results():
  attention_record = {"variant": "rel_kv", "n": 1024, "batch": 2, "heads": 8, "depth": 64,
                      "k": 16, "seconds": 1.0, "time_ratio": 1.1, "temp_bytes": 130,
                      "temp_ratio": 1.3, "flops": 2e9, "flops_ratio": 1.05}
  plain = dict(attention_record, variant="plain", k=None, time_ratio=1.0, temp_bytes=100,
               temp_ratio=1.0, flops_ratio=1.0)
  step = {"task": "synthetic", "batch_size": 32, "length": 48, "model": {}, "devices": 1,
          "records": [{"variant": v, "seconds": s, "steps_per_second": 1 / s,
                       "time_ratio": s / 0.1, "flops_ratio": 1.0, "temp_bytes": 1000, "flops": 1}
                      for v, s in (("abs", 0.1), ("rel_kv", 0.104))]}
  decoding = {"records": [{"task": "synthetic", "variant": "rel_kv", "search": "beam4",
                           "output_length": 64, "cached_sentences_per_second": 40.0,
                           "uncached_sentences_per_second": 4.0, "cache_speedup": 10.0}],
              "sentences": 16, "source_length": 24, "output_length": 64}
  per_kind = {kind: 0.001 for kind in profile.KINDS}
  profiled = {"task": "synthetic", "steps": 4, "rounds": 2, "records": [
      {"variant": "abs", "seconds_per_kind": per_kind, "total": 0.007, "flops": 100.0},
      {"variant": "rel_kv", "seconds_per_kind": dict(per_kind, gather=0.0017), "total": 0.0077,
       "flops": 108.0}]}
  machine = {"platform": "Linux", "cpu_count": 2, "jax": "0", "date": "today",
             "devices": ["cpu"]}
  return {"cpu": {"machine": machine, "load": [1.0, 1.0, 1.0],
                  "attention": {"records": [plain, attention_record], "check": {}, "notes": [],
                                "dtype": "float32", "heads": 8, "depth": 64},
                  "train_step": {"tasks": [step], "notes": []}, "profile": profiled,
                  "decode": decoding}}


def test_targets_are_judged_from_the_ratios():
  verdicts = {t.split(" (")[0]: (met, value) for t, met, value in run.targets(_results()["cpu"])}
  assert verdicts["rel_kv train step <= 1.05x abs"] == ("yes", "1.040x (FLOPs 1.000x)")
  assert verdicts["rel_kv temp memory <= 1.25x plain"] == ("no", "1.30x")
  assert verdicts["cached beam search >= 5.0x uncached"] == ("yes", "10.0x")


def test_markdown_has_every_section():
  text = run.render(_results())
  for heading in ("## cpu: cpu", "### attention", "### train_step", "### profile", "### decode"):
    assert heading in text
  assert "| gather | 1.00 | 1.70 | +0.70 | +10.0% |" in text
  assert "| total | 7.00 | 7.70 | +0.70 | +10.0% |" in text
  assert "rel_kv / abs: 1.080x." in text
  assert "| 1024 | 2 | rel_kv | 16 | 1.10x | 0.0 | 1.30x | 2.00 | 1.05x |" in text


def test_profile_attributes_instructions_to_kinds():
  hlo = """
  %ynn_fusion.3 = f32[8,16]{1,0} fusion(%a, %b), kind=kCustom, metadata={op_name="jit(f)/jvp(bhqd,rd->bhqr)/dot_general"}
  %bitcast_gather_fusion = f32[8]{0} fusion(%c), kind=kLoop, metadata={op_name="jit(f)/gather"}
  %select_reduce_fusion = (f32[8]{0}, f32[8]{0}) fusion(%d), kind=kLoop, metadata={op_name="jit(f)/reduce"}
  %cond.8 = (f32[8]{0}) conditional(%p, %x, %y), branch_computations={%a, %b}
  %while.7 = (s32[]) while(%t), condition=%c, body=%b, metadata={op_name="jit(f)/jit(_uniform)/while"}
  %broadcast_add_fusion = u32[8]{0} fusion(%e), kind=kLoop, metadata={op_name="jit(f)/jit(_bernoulli)/jit(_uniform)/while/body/add"}
  ROOT %copy_bitcast_fusion = f32[16,8]{1,0} fusion(%f), kind=kLoop
"""
  sources = profile.instruction_sources(hlo)
  assert "cond.8" not in sources and "while.7" not in sources  # containers: never counted twice
  kinds = {name: profile.kind(name, source) for name, source in sources.items()}
  assert kinds == {"ynn_fusion.3": "matmul", "bitcast_gather_fusion": "gather",
                   "select_reduce_fusion": "reduction", "broadcast_add_fusion": "dropout RNG",
                   "copy_bitcast_fusion": "transpose/copy"}


def test_profile_step_reads_the_trace_of_the_installed_jax():
  a = np.ones((256, 256), np.float32)
  compiled = jax.jit(lambda x: jnp.tanh(x @ x)).lower(a).compile()
  seconds = profile.profile_step(lambda: compiled(a), profile.instruction_sources(
      compiled.as_text()), steps=2)
  assert set(seconds) == set(profile.KINDS)
  assert seconds["matmul"] > 0 and sum(seconds.values()) > seconds["matmul"]
