"""Tests for relpos.experiments.timing: whether a run's steps per second were timed alone."""

import fake_results
from relpos.experiments import timing


def _run(row, seed, *, load=fake_results.TIMED_ALONE, started=None, finished=None):
  run = fake_results.run_record("ablation", row, seed, 50.0, 10.0, load=load)
  if started:
    run["starts"] = [{"started_at": started, "step": 0, "commit": "abc1234", "cpus": 2}]
    run["environment"] = {"finished_at": finished}
  return run


LOADED = {"median_load_average": 3.4, "cpus": 2, "loaded_share": 0.31, "unrecorded_share": 0.0}
HALF_UNRECORDED = {**fake_results.TIMED_ALONE, "unrecorded_share": 0.5}


def test_caveat_names_why_a_run_was_not_timed_alone():
  alone = _run("abs", 0)
  assert timing.caveat(alone, [alone]) is None
  assert timing.caveat(_run("abs", 0, load=None), []) == "load not recorded"
  assert timing.caveat(_run("abs", 0, load=HALF_UNRECORDED), []) == "load not recorded"
  assert timing.caveat(_run("abs", 0, load=LOADED), []) == "machine loaded"
  # At the limit still alone: one loaded record in ten is a passing job, not a shared machine.
  at_limit = {**fake_results.TIMED_ALONE, "loaded_share": timing.LOADED_SHARE_LIMIT}
  assert timing.caveat(_run("abs", 0, load=at_limit), []) is None


def test_runs_that_trained_at_the_same_time_are_not_timed_alone():
  first = _run("abs", 0, started="2026-11-24T08:00:00Z", finished="2026-11-24T10:00:00+00:00")
  after = _run("rel_kv", 0, started="2026-11-24T10:00:05Z", finished="2026-11-24T12:00:00+00:00")
  beside = _run("none", 0, started="2026-11-24T09:00:00Z", finished="2026-11-24T11:00:00+00:00")
  assert timing.caveat(first, [first, after]) is None  # one after the other
  assert timing.caveat(first, [first, after, beside]) == "trained beside other runs"
  assert timing.caveat(after, [first, after, beside]) == "trained beside other runs"
  unrecorded = _run("rel_v", 0)  # no starts: cannot be placed in time, so never beside
  assert timing.caveat(unrecorded, [first, unrecorded]) is None


def test_runs_timed_on_other_machines_are_not_compared():
  """A table restored from one machine's published runs and continued on another."""
  amd, intel, unknown = _run("abs", 0), _run("rel_kv", 0), _run("rel_kv", 1)
  amd["environment"] = {"device_kind": "cpu", "host_cpu": "AMD EPYC (avx2)"}
  intel["environment"] = {"device_kind": "cpu", "host_cpu": "Intel Xeon (avx2)"}
  assert timing.caveat(amd, [amd, unknown]) is None  # a run that predates the record
  assert timing.caveat(amd, [amd, intel]) == "timed on another machine than most runs"  # a tie
  assert timing.caveat(unknown, [amd, intel, unknown]) is None  # its own machine unknown
  twin = {**amd, "seed": 1}
  assert timing.caveat(amd, [amd, twin]) is None
  # Most runs on one machine: the run on the other is the one named, not theirs.
  assert timing.caveat(amd, [amd, twin, intel]) is None
  assert timing.caveat(intel, [amd, twin, intel]) == "timed on another machine than most runs"


def test_the_machines_a_run_trained_on_are_its_starts():
  """Each start records its machine: a run resumed on another machine was timed on both (its
  environment names only the machine of its final evaluation)."""
  amd, intel = ("cpu", "AMD EPYC (avx2)"), ("cpu", "Intel Xeon (avx2)")

  def started_on(run, *machines):
    run["starts"] = [{
        "started_at": f"2026-11-2{i}T00:00:00Z", "step": 100 * i, "commit": "abc1234", "cpus": 2,
        "device_kind": kind, "host_cpu": cpu
    } for i, (kind, cpu) in enumerate(machines)]
    run["environment"] = {"device_kind": "cpu", "host_cpu": machines[-1][1]}
    return run

  moved = started_on(_run("abs", 0), amd, intel)
  twin, other = started_on(_run("abs", 1), amd), started_on(_run("abs", 2), amd)
  assert timing.caveat(moved, [moved, twin, other]) == "timed on several machines"
  assert timing.caveat(twin, [moved, twin, other]) is None  # most runs: one machine, the same
  evaluated_elsewhere = started_on(_run("rel_kv", 0), amd)
  evaluated_elsewhere["environment"]["host_cpu"] = intel[1]  # trained on amd, scored on intel
  assert timing.caveat(evaluated_elsewhere, [evaluated_elsewhere, twin, other]) is None
  # A start at the last trained step (to evaluate) trains nothing: not a machine it was timed on.
  scored_elsewhere = started_on(_run("rel_kv", 1), amd, intel)
  scored_elsewhere["validation_curve"] = [[50, 1.0], [100, 2.0]]
  assert timing.caveat(scored_elsewhere, [scored_elsewhere, twin, other]) is None
  # A start written before starts recorded machines: that of a later start on its host, else
  # unknown (another machine).
  resumed = started_on(_run("rel_v", 0), amd, amd)
  resumed["starts"][0] = {**resumed["starts"][0], "host": "a"}
  resumed["starts"][1]["host"] = "a"
  del resumed["starts"][0]["host_cpu"], resumed["starts"][0]["device_kind"]
  assert timing.caveat(resumed, [resumed, twin, other]) is None
  resumed["starts"][0]["host"] = "b"
  assert timing.caveat(resumed, [resumed, twin, other]) == "timed on several machines"


def test_describe_load():
  assert timing.describe_load(_run("abs", 0)) == "1.5 / 2 cores"
  assert timing.describe_load(_run("abs", 0, load=LOADED)) == "3.4 / 2 cores, loaded 31%"
  assert timing.describe_load(_run("abs", 0, load=None)) == "–"
  assert timing.describe_load(_run("abs", 0,
                                   load=HALF_UNRECORDED)) == ("1.5 / 2 cores, recorded for 50%")


def test_untimed_runs_grouped_by_cause():
  runs = [
      _run("abs", 0, load=None),
      _run("abs", 1, load=None),
      _run("abs", 2, load=LOADED),
      _run("rel_kv", 0, load=None),
      _run("rel_kv", 1),
      _run("none", 0, load=None)
  ]
  assert timing.untimed_runs(
      runs, "ablation",
      ("rel_kv",
       "abs")) == ("load not recorded (abs seeds 0, 1; rel_kv seed 0); machine loaded (abs seed 2)")
  assert timing.untimed_runs(runs, "k_sweep", ("rel_kv", "abs")) == ""
