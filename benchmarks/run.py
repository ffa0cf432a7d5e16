"""Runs the benchmarks and writes `results.json` and `results.md` (issue targets checked).

  python -m benchmarks.run                       # everything (17.5 minutes on 2 idle CPU cores)
  python -m benchmarks.run --quick               # fewer lengths, variants and rounds
  python -m benchmarks.run --sections=decode     # some of: attention, train_step, profile,
                                                 # decode, seed_stack, checkpoint

Sections not run keep their previous results in `results.json`, so a GPU run can add its
figures beside the CPU ones: results are stored per backend and device kind (`cpu: cpu`,
`gpu: NVIDIA H200`), so a run on an H100 adds its own beside an H200's.
"""
import json
import os
from collections.abc import Callable
from typing import Any

import jax
from absl import app
from absl import flags

from benchmarks import attention
from benchmarks import common
from benchmarks import decode
from benchmarks import profile
from benchmarks import checkpoint
from benchmarks import seed_stack
from benchmarks import train_step
from relpos import prng

SECTIONS: dict[str, Callable[..., dict[str, Any]]] = {
    "attention": attention.run, "train_step": train_step.run, "profile": profile.run,
    "profile_recipe": profile.run_recipe, "decode": decode.run, "seed_stack": seed_stack.run,
    "checkpoint": checkpoint.run
}
HERE = os.path.dirname(os.path.abspath(__file__))

# The project's targets, as ratios measured side by side.
# rel_kv train step time / abs, per backend (on a GPU: the Multi30K recipe in bfloat16).
TRAIN_STEP_TARGETS = {"cpu": 1.05, "gpu": 1.10}
# Sections that run on a CPU backend alone (on an H200 the profile attributed no time).
CPU_ONLY = ("profile", "profile_recipe")
MEMORY_TARGET = 1.25  # rel_kv attention temporary memory / plain, at n = MEMORY_TARGET_LENGTH
MEMORY_TARGET_LENGTH = 1024
CACHE_TARGET = 5.0  # uncached / cached beam search time at the benchmark's output length

_SECTIONS = flags.DEFINE_list("sections", list(SECTIONS), "Benchmarks to run.")
_QUICK = flags.DEFINE_bool("quick", False, "Fewer lengths, variants and rounds.")
_RESULTS_DIR = flags.DEFINE_string("results_dir", HERE, "Where results.json and results.md go.")


def _mib(value: float | None) -> str:
  return "–" if value is None else f"{value / 2 ** 20:.1f}"


def _ratio(value: float | None) -> str:
  return "–" if value is None else f"{value:.2f}x"


def attention_markdown(section: dict[str, Any]) -> list[str]:
  # Results without "model_dim" timed the kernel alone, on given queries, keys and values.
  what = ("Forward + backward" if "model_dim" not in section else
          f"One decoder self-attention layer as the model builds it (model dim "
          f"{section['model_dim']}, projections included), forward + backward")
  lines = [
      f"{what}, {section['heads']} heads, depth {section['depth']}, "
      f"{section['dtype']}, causal mask; ratios to `plain` of the same n.", "",
      "| n | batch | variant | k | time | temp MiB | temp | GFLOP | FLOPs |",
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
  ]
  for r in section["records"]:
    flops = "–" if r["flops"] is None else f"{r['flops'] / 1e9:.2f}"
    lines.append(f"| {r['n']} | {r['batch']} | {r['variant']} | {r['k'] or '–'} | "
                 f"{_ratio(r['time_ratio'])} | {_mib(r['temp_bytes'])} | "
                 f"{_ratio(r['temp_ratio'])} | {flops} | {_ratio(r['flops_ratio'])} |")
  growth = attention.temp_growth(section["records"])
  lines += [
      "", "rel_kv extra temporary memory over plain grows as n^p per row, p fitted between the "
      "two longest lengths where rel_kv needs more than plain: " +
      ", ".join(f"k={k}: p={p:.2f} (n={growth['fitted_between'][k][0]} to "
                f"{growth['fitted_between'][k][1]})"
                for k, p in growth["exponent_per_row"].items()) + "."
  ]
  lines += [f"- {note}" for note in section["notes"]]
  return lines


def train_step_markdown(section: dict[str, Any]) -> list[str]:
  lines = []
  for task in section["tasks"]:
    lines += [
        f"**{task['task']}** model {task['model']}, batch {task['batch_size']} x "
        f"{task['length']} tokens, {task['devices']} device(s):", "",
        "| variant | ms/step | steps/s | time vs abs | FLOPs vs abs | temp MiB |",
        "| --- | --- | --- | --- | --- | --- |"
    ]
    for r in task["records"]:
      lines.append(f"| {r['variant']} | {r['seconds'] * 1e3:.1f} | {r['steps_per_second']:.2f} | "
                   f"{_ratio(r['time_ratio'])} | {_ratio(r['flops_ratio'])} | "
                   f"{_mib(r['temp_bytes'])} |")
    lines.append("")
  lines += [f"- {note}" for note in section["notes"]]
  return lines


def _batch_text(section: dict[str, Any]) -> str:
  """", batch 64 x 64 tokens, float32" where the section records them (older ones do not)."""
  if "batch_size" not in section:
    return ""
  return f", batch {section['batch_size']} x {section['length']} tokens, {section['dtype']}"


def profile_markdown(section: dict[str, Any]) -> list[str]:
  base, other = section["records"][0], section["records"][1]
  lines = [
      f"Train step of the {section['task']} model{_batch_text(section)} under "
      f"`jax.profiler` (slower than unprofiled), XLA instruction time per kind of work in ms "
      f"per step: medians of {section['rounds']} rounds, the variants profiled in turns.", "",
      f"| kind | {base['variant']} | {other['variant']} | extra | extra / "
      f"{base['variant']} step |", "| --- | --- | --- | --- | --- |"
  ]
  for name in [*profile.KINDS, "total"]:
    a = base["total"] if name == "total" else base["seconds_per_kind"][name]
    b = other["total"] if name == "total" else other["seconds_per_kind"][name]
    lines.append(f"| {name} | {a * 1e3:.2f} | {b * 1e3:.2f} | {(b - a) * 1e3:+.2f} | "
                 f"{(b - a) / base['total']:+.1%} |")
  if base["flops"] and other["flops"]:
    lines += [
        "", f"FLOPs (XLA cost analysis) {other['variant']} / {base['variant']}: "
        f"{other['flops'] / base['flops']:.3f}x."
    ]
  return lines


def decode_markdown(section: dict[str, Any]) -> list[str]:
  lines = [
      f"{section['sentences']} sentences of {section['source_length']} tokens, "
      f"{section['output_length']} output tokens each (eos disabled).", "",
      "| task | variant | search | cached sent/s | uncached sent/s | cache speedup |",
      "| --- | --- | --- | --- | --- | --- |"
  ]
  for r in section["records"]:
    lines.append(f"| {r['task']} | {r['variant']} | {r['search']} | "
                 f"{r['cached_sentences_per_second']:.1f} | "
                 f"{r['uncached_sentences_per_second']:.1f} | {r['cache_speedup']:.1f}x |")
  return lines


def checkpoint_markdown(section: dict[str, Any]) -> list[str]:
  lines = [
      "A checkpoint save of the `abs` train state (parameters, Adam's moments; as training "
      "saves it): the call that blocks the step, and the time until Orbax has written it in "
      "the background (medians).", "", "| task | state MiB | saves | blocks the step ms | "
      "written after ms |", "| --- | --- | --- | --- | --- |"
  ]
  for r in section["records"]:
    lines.append(f"| {r['task']} | {r['state_mib']:.1f} | {r['saves']} | "
                 f"{r['blocking_seconds'] * 1e3:.0f} | {r['written_seconds'] * 1e3:.0f} |")
  return lines


def seed_stack_markdown(section: dict[str, Any]) -> list[str]:
  lines = [
      "A row's seeds trained as one program (`--stack_seeds`) against one after another: the "
      "`abs` train step of the train_step section's models, vmapped over the seeds.", "",
      "| task | batch | seeds | one seed ms/step | stacked ms/step | gain |",
      "| --- | --- | --- | --- | --- | --- |"
  ]
  for r in section["records"]:
    lines.append(f"| {r['task']} | {r['batch_size']} x {r['length']} | {r['seeds']} | "
                 f"{r['one_seed_seconds'] * 1e3:.1f} | {r['stacked_seconds'] * 1e3:.1f} | "
                 f"{r['gain']:.2f}x |")
  return lines + ["", "gain = seeds x one seed's step / the stacked step: above 1x, stacking pays."]


def targets(results: dict[str, Any], backend: str) -> list[tuple[str, str, str]]:
  """(target, met: yes / no / not run, measured) for each of the project's targets."""
  out = []
  step = results.get("train_step")
  target = TRAIN_STEP_TARGETS.get(backend, TRAIN_STEP_TARGETS["gpu"])
  if step:
    for task in step["tasks"]:
      record = {r["variant"]: r for r in task["records"]}["rel_kv"]
      flops = "" if record["flops_ratio"] is None else f" (FLOPs {record['flops_ratio']:.3f}x)"
      out.append((f"rel_kv train step <= {target}x abs ({task['task']})",
                  "yes" if record["time_ratio"] <= target else "no",
                  f"{record['time_ratio']:.3f}x{flops}"))
  att = results.get("attention")
  if att:
    for r in att["records"]:
      if r["variant"] == "rel_kv" and r["n"] == MEMORY_TARGET_LENGTH and r["temp_ratio"]:
        out.append((f"rel_kv temp memory <= {MEMORY_TARGET}x plain (n={r['n']}, k={r['k']})",
                    "yes" if r["temp_ratio"] <= MEMORY_TARGET else "no", f"{r['temp_ratio']:.2f}x"))
  dec = results.get("decode")
  if dec:
    for r in dec["records"]:
      if r["search"] == "beam4":
        out.append(
            (f"cached beam search >= {CACHE_TARGET}x uncached ({r['task']}, "
             f"{r['variant']}, {r['output_length']} tokens)",
             "yes" if r["cache_speedup"] >= CACHE_TARGET else "no", f"{r['cache_speedup']:.1f}x"))
  return out


def machine_key(backend: str, machine: dict[str, Any]) -> str:
  """Where a machine's results are stored: "<backend>: <its device kinds>"."""
  return f"{backend}: {', '.join(sorted(set(machine['devices'])))}"


def by_machine(all_results: dict[str, Any]) -> dict[str, Any]:
  """`all_results` keyed by `machine_key` (results.json before 28 November 2026 keyed them by
  backend alone, so an H100's run replaced an H200's)."""
  return {
      machine_key(results["machine"].get("backend",
                                         key.split(":")[0]), results["machine"]): results
      for key, results in all_results.items()
  }


def render(all_results: dict[str, Any]) -> str:
  """`results.md` from the stored results of every backend and device kind."""
  lines = [
      "# relpos benchmarks", "",
      "Made by `python -m benchmarks.run` (see `benchmarks/run.py`). Times are medians of "
      "interleaved repeats in one process; ratios compare variants of the same run.", ""
  ]
  renderers = {
      "attention": attention_markdown, "train_step": train_step_markdown,
      "profile": profile_markdown, "profile_recipe": profile_markdown, "decode": decode_markdown,
      "seed_stack": seed_stack_markdown, "checkpoint": checkpoint_markdown
  }
  for key, results in sorted(by_machine(all_results).items()):
    machine, backend = results["machine"], key.split(":")[0]
    lines += [
        f"## {key}", "",
        f"Last run: {machine['platform']}, {machine['cpu_count']} CPUs, jax {machine['jax']}, "
        f"{machine['date']}; load average at the end {results.get('load')}. A section run "
        f"since 28 November 2026 says when it was measured.", "", "| target | met | measured |",
        "| --- | --- | --- |"
    ]
    lines += [f"| {t} | {met} | {value} |" for t, met, value in targets(results, backend)]
    lines.append("")
    for name, render_section in renderers.items():
      if name in results:
        lines += [f"### {name}", "", *_measured(results[name]), *render_section(results[name]), ""]
  return "\n".join(lines)


def _measured(section: dict[str, Any]) -> list[str]:
  """When and where a section was measured, where it says (sections run before 28 November
  2026 do not: the header's last run is not necessarily theirs)."""
  measured = section.get("measured")
  if not measured:
    return []
  return [
      f"Measured {measured['date']} on {measured['platform']}, jax {measured['jax']}; "
      f"load average at the end {measured['load']}.", ""
  ]


def runs_on(section: str, backend: str) -> bool:
  """Whether `section` runs on `backend` (CPU_ONLY ones on a CPU alone)."""
  return backend == "cpu" or section not in CPU_ONLY


def _write(path: str, text: str) -> None:
  """Writes `text` to `path` whole (a temporary file renamed), making its folder."""
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    f.write(text)
  os.replace(tmp, path)


def main(argv: list[str]) -> None:
  del argv
  prng.lower_threefry_unrolled_on_cpu()  # as relpos's programs do (cli.start)
  unknown = set(_SECTIONS.value) - set(SECTIONS)
  if unknown:
    raise app.UsageError(f"--sections: unknown {sorted(unknown)}; allowed: {list(SECTIONS)}.")
  json_path = os.path.join(_RESULTS_DIR.value, "results.json")
  all_results = {}
  if os.path.exists(json_path):
    with open(json_path, encoding="utf-8") as f:
      all_results = json.load(f)
  backend, machine = jax.default_backend(), common.machine()
  all_results = by_machine(all_results)
  results = all_results.setdefault(machine_key(backend, machine), {})
  results["machine"] = machine
  for name in _SECTIONS.value:
    if not runs_on(name, backend):
      common.progress(f"section {name}: skipped, it reads XLA:CPU's trace (CPU only)")
      continue
    common.progress(f"section {name}")
    results[name] = SECTIONS[name](quick=_QUICK.value)
    results["load"] = common.load()
    results[name]["measured"] = {
        "date": machine["date"], "platform": machine["platform"], "jax": machine["jax"],
        "load": results["load"]
    }
    _write(json_path, json.dumps(all_results, indent=1))  # each finished section is kept
  _write(os.path.join(_RESULTS_DIR.value, "results.md"), render(all_results))
  print(render(all_results))


if __name__ == "__main__":
  app.run(main)
