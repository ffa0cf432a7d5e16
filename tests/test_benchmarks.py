"""Tests for benchmarks/: the variants they time compute the right thing, and the report.

The benchmarks themselves are not run here (minutes, not in CI); these check their building
blocks at tiny sizes.
"""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl import flags
from absl.testing import flagsaver
from flax import nnx

from benchmarks import attention
from benchmarks import checkpoint
from benchmarks import common
from benchmarks import decode
from benchmarks import profile
from benchmarks import run
from benchmarks import seed_stack
from benchmarks import train_step
from relpos import variants
from relpos.data import pipeline


def test_attention_variants_match_their_references():
  errors = attention.check_variants()
  assert errors and max(errors.values()) < 1e-4, errors


def test_attention_variants_are_the_registered_layers():
  for variant, (position, _) in attention.POSITIONS.items():
    config = attention.layer_config(variant, 2, jnp.float32)
    layer = attention.build_layer(variant, 2)
    expected = variants.get(position)(config).self_attention(1, causal=True, rngs=nnx.Rngs(0))[0]
    assert type(layer.position) is type(expected) and config.position == position
  assert set(attention.POSITIONS) == set(attention.FIXED + attention.RELATIVE)


def test_packed_batch_holds_whole_segments():
  batch = train_step.packed_batch(rows=3, length=40, vocab_size=50)
  assert set(batch) == set(pipeline.BATCH_KEYS)
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
  attention_record = {
      "variant": "rel_kv", "n": 1024, "batch": 2, "heads": 8, "depth": 64, "k": 16, "seconds": 1.0,
      "time_ratio": 1.1, "temp_bytes": 130, "temp_ratio": 1.3, "flops": 2e9, "flops_ratio": 1.05
  }
  plain = dict(attention_record, variant="plain", k=None, time_ratio=1.0, temp_bytes=100,
               temp_ratio=1.0, flops_ratio=1.0)
  step = {
      "task": "synthetic", "batch_size": 32, "length": 48, "model": {}, "devices": 1, "records": [{
          "variant": v, "seconds": s, "steps_per_second": 1 / s, "time_ratio": s / 0.1,
          "flops_ratio": 1.0, "temp_bytes": 1000, "flops": 1
      } for v, s in (("abs", 0.1), ("rel_kv", 0.104))]
  }
  decoding = {
      "records": [{
          "task": "synthetic", "variant": "rel_kv", "search": "beam4", "output_length": 64,
          "cached_sentences_per_second": 40.0, "uncached_sentences_per_second": 4.0,
          "cache_speedup": 10.0
      }], "sentences": 16, "source_length": 24, "output_length": 64
  }
  per_kind = {kind: 0.001 for kind in profile.KINDS}
  profiled = {
      "task": "synthetic", "steps": 4, "rounds": 2,
      "records": [{"variant": "abs", "seconds_per_kind": per_kind, "total": 0.007, "flops": 100.0},
                  {
                      "variant": "rel_kv", "seconds_per_kind": dict(per_kind, gather=0.0017),
                      "total": 0.0077, "flops": 108.0
                  }]
  }
  recipe = dict(profiled, task="multi30k_gpu", batch_size=64, length=64, dtype="float32")
  machine = {"platform": "Linux", "cpu_count": 2, "jax": "0", "date": "today", "devices": ["cpu"]}
  return {
      "cpu": {
          "machine": machine, "load": [1.0, 1.0, 1.0], "attention": {
              "records": [plain, attention_record], "check": {}, "notes": [], "dtype": "float32",
              "heads": 8, "depth": 64
          }, "train_step": {"tasks": [step], "notes": []}, "profile": profiled,
          "profile_recipe": recipe, "decode": decoding, "seed_stack": {
              "records": [{
                  "task": "synthetic", "seeds": 3, "batch_size": 32, "length": 48, "devices": 1,
                  "one_seed_seconds": 0.1, "stacked_seconds": 0.25, "gain": 1.2
              }]
          }
      }
  }


def test_targets_are_judged_from_the_ratios():
  verdicts = {
      t.split(" (")[0]: (met, value) for t, met, value in run.targets(_results()["cpu"], "cpu")
  }
  assert verdicts["rel_kv train step <= 1.05x abs"] == ("yes", "1.040x (FLOPs 1.000x)")
  assert verdicts["rel_kv temp memory <= 1.25x plain"] == ("no", "1.30x")
  assert verdicts["cached beam search >= 5.0x uncached"] == ("yes", "10.0x")


def test_profile_runs_on_cpu_only():
  sections = ["train_step", "profile", "profile_recipe", "decode"]
  assert [s for s in sections if run.runs_on(s, "cpu")] == sections
  assert [s for s in sections if run.runs_on(s, "gpu")] == ["train_step", "decode"]


def test_markdown_has_every_section():
  text = run.render(_results())
  for heading in ("## cpu: cpu", "### attention", "### train_step", "### profile",
                  "### profile_recipe", "### decode", "### seed_stack"):
    assert heading in text
  assert "Train step of the synthetic model under `jax.profiler`" in text  # recorded before
  assert ("Train step of the multi30k_gpu model, batch 64 x 64 tokens, float32 under "
          "`jax.profiler`") in text
  assert "| synthetic | 32 x 48 | 3 | 100.0 | 250.0 | 1.20x |" in text
  assert "| gather | 1.00 | 1.70 | +0.70 | +10.0% |" in text
  assert "| total | 7.00 | 7.70 | +0.70 | +10.0% |" in text
  assert "rel_kv / abs: 1.080x." in text
  assert "| 1024 | 2 | rel_kv | 16 | 1.10x | 0.0 | 1.30x | 2.00 | 1.05x |" in text
  results = _results()
  results["cpu"]["attention"]["model_dim"] = 512
  assert "layer as the model builds it (model dim 512, projections" in run.render(results)


def test_profile_attributes_instructions_to_kinds():
  hlo = """
%fused_dot (p0: f32[8,4], p1: f32[4,16]) -> f32[8,16] {
  %p0 = f32[8,4]{1,0} parameter(0)
  %p1 = f32[4,16]{1,0} parameter(1)
  %dot.0 = f32[8,16]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %tanh.0 = f32[8,16]{1,0} tanh(%dot.0)
}

%fused_select_gather (p0: f32[8,4], p1: s32[8,2]) -> f32[8] {
  %p0 = f32[8,4]{1,0} parameter(0)
  %p1 = s32[8,2]{1,0} parameter(1)
  %gather.0 = f32[8]{0} gather(%p0, %p1), offset_dims={}
  ROOT %select.0 = f32[8]{0} select(%c, %gather.0, %gather.0)
}

%fused_sums (p0: f32[8,4]) -> (f32[8]{0}, f32[8]{0}) {
  %p0 = f32[8,4]{1,0} parameter(0)
  ROOT %reduce.0 = (f32[8]{0}, f32[8]{0}) reduce(%p0, %p0, %z, %z), dimensions={1}
}

%fused_dropout (p0: f32[8], p1: u32[8]) -> f32[8] {
  %p0 = f32[8]{0} parameter(0)
  %p1 = u32[8]{0} parameter(1)
  %shl.0 = u32[8]{0} shift-left(%p1, %p1)
  %shr.0 = u32[8]{0} shift-right-logical(%p1, %p1)
  %xor.0 = u32[8]{0} xor(%shl.0, %shr.0)
  ROOT %select.1 = f32[8]{0} select(%c, %p0, %p0)
}

%fused_transpose (p0: f32[8,16]) -> f32[16,8] {
  %p0 = f32[8,16]{1,0} parameter(0)
  ROOT %transpose.0 = f32[16,8]{1,0} transpose(%p0), dimensions={1,0}
}

ENTRY %main (a: f32[8,4], b: f32[4,16]) -> f32[16,8] {
  %ynn_fusion.3 = f32[8,16]{1,0} fusion(%a, %b), kind=kCustom, calls=%fused_dot, metadata={op_name="jit(f)/jvp(bhqd,rd->bhqr)/dot_general"}
  %copy_select_fusion = f32[8]{0} fusion(%a, %i), kind=kLoop, calls=%fused_select_gather, metadata={op_name="jit(f)/cond/select_n"}
  %select_reduce_fusion = (f32[8]{0}, f32[8]{0}) fusion(%a), kind=kLoop, calls=%fused_sums
  %cond.8 = (f32[8]{0}) conditional(%p, %x, %y), branch_computations={%a, %b}
  %while.7 = (s32[]) while(%t), condition=%c, body=%b, metadata={op_name="jit(f)/jit(_uniform)/while"}
  %broadcast_add = u32[8]{0} add(%e, %e), metadata={op_name="jit(f)/jit(_bernoulli)/jit(_uniform)/while/body/add"}
  %copy.2 = u32[32,48,64]{2,1,0} copy(%g)
  %add.1 = f32[8]{0} add(%h, %i)
  %select_add_fusion.8 = f32[8]{0} fusion(%h, %k), kind=kLoop, calls=%fused_dropout, metadata={op_name="jit(f)/jvp()/add"}
  ROOT %bitcast_fusion = f32[16,8]{1,0} fusion(%ynn_fusion.3), kind=kLoop, calls=%fused_transpose
}
"""
  kinds = profile.instruction_kinds(hlo)
  entry = {
      name: kinds[name]
      for name in ("ynn_fusion.3", "copy_select_fusion", "select_reduce_fusion", "broadcast_add",
                   "copy.2", "add.1", "select_add_fusion.8", "bitcast_fusion")
  }
  assert entry == {
      "ynn_fusion.3": "matmul", "copy_select_fusion": "gather", "select_reduce_fusion": "reduction",
      "broadcast_add": "dropout RNG", "copy.2": "dropout RNG", "add.1": "elementwise",
      "select_add_fusion.8": "dropout RNG", "bitcast_fusion": "transpose/copy"
  }
  assert "cond.8" not in kinds and "while.7" not in kinds  # containers: never counted twice


def test_profile_step_reads_the_trace_of_the_installed_jax():
  a = np.ones((256, 256), np.float32)
  compiled = jax.jit(lambda x: jnp.tanh(x @ x)).lower(a).compile()
  seconds = profile.profile_step(lambda: compiled(a), profile.instruction_kinds(compiled.as_text()),
                                 steps=2)
  assert set(seconds) == set(profile.KINDS)
  assert seconds["matmul"] > 0 and min(seconds.values()) >= 0


def test_results_go_to_a_new_folder(tmp_path):
  path = tmp_path / "new" / "results.md"
  run._write(str(path), "text")
  assert path.read_text(encoding="utf-8") == "text"


def test_seed_stack_times_one_seed_and_the_stacked_step(monkeypatch):
  monkeypatch.setattr(train_step, "batch_sizes", lambda: {"synthetic": 4})
  [record] = seed_stack.run(rounds=1)["records"]
  assert (record["task"], record["seeds"], record["batch_size"]) == ("synthetic", 3, 4)
  assert record["one_seed_seconds"] > 0 and record["stacked_seconds"] > 0
  assert record["gain"] == pytest.approx(3 * record["one_seed_seconds"] / record["stacked_seconds"])


def test_results_of_another_device_are_kept_beside_not_relabelled(tmp_path, monkeypatch):
  """A partial rerun on another device (an H100 after an H200) adds its results under its own
  device kind: the other device's stay, under theirs (a results.json keyed by backend alone,
  as before 28 November 2026, is read by device kind)."""
  backend = jax.default_backend()
  old = {"machine": {**common.machine(), "devices": ["NVIDIA H200"]}, "older": {"x": 1}}
  (tmp_path / "results.json").write_text(json.dumps({backend: old}), encoding="utf-8")
  monkeypatch.setitem(run.SECTIONS, "fake", lambda quick: {"records": []})
  flags.FLAGS.mark_as_parsed()
  with flagsaver.flagsaver(sections=["fake"], results_dir=str(tmp_path)):
    run.main([])
  stored = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
  this = f"{backend}: {', '.join(sorted(set(common.machine()['devices'])))}"
  assert sorted(stored) == sorted([f"{backend}: NVIDIA H200", this])
  assert stored[f"{backend}: NVIDIA H200"]["older"] == {"x": 1}
  assert stored[this]["fake"]["records"] == [] and "older" not in stored[this]
  text = (tmp_path / "results.md").read_text(encoding="utf-8")
  assert f"## {backend}: NVIDIA H200" in text and f"## {this}" in text
  # The section says when it was measured; the older machine's sections do not.
  assert stored[this]["fake"]["measured"]["date"] == stored[this]["machine"]["date"]


def test_checkpoint_times_the_blocking_save_and_the_written_one(monkeypatch):
  monkeypatch.setattr(checkpoint, "TASKS", ("synthetic",))
  [record] = checkpoint.run(saves=2)["records"]
  assert (record["task"], record["saves"]) == ("synthetic", 2)
  assert 0 < record["blocking_seconds"] <= record["written_seconds"]
  assert 0.5 < record["state_mib"] < 50  # parameters and Adam's two moments, float32
  text = run.checkpoint_markdown({"records": [record]})
  assert text[-1].startswith(f"| synthetic | {record['state_mib']:.1f} | 2 | ")
