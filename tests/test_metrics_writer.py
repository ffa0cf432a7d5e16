"""Tests for relpos.metrics_writer: records, a run's seconds over its starts, start records."""

import json
import time

import pytest

from relpos import metrics_writer


def test_elapsed_seconds_takes_the_last_train_clock_and_the_validations_after_it():
  records = [
      {"step": 50, "split": "train", "elapsed_s": 10.0, "steps_per_second": 5.0},
      {"step": 100, "split": "train", "elapsed_s": 20.0, "steps_per_second": 5.0},
      {"step": 100, "split": "validation", "time_s": 4.0},  # written after step 100's clock
  ]
  assert metrics_writer.elapsed_seconds(records) == 24.0
  records.append({"step": 150, "split": "train", "elapsed_s": 35.0})  # includes validation
  assert metrics_writer.elapsed_seconds(records) == 35.0


def test_elapsed_seconds_estimates_records_from_before_the_clock():
  """Records without elapsed_s (older runs) count each interval's steps over its speed, and a
  later clock carries that estimate on (it started from it)."""
  records = [
      {"step": 50, "split": "train", "steps_per_second": 2.0},  # 25 s
      {"step": 100, "split": "train", "steps_per_second": 5.0},  # 10 s
      {"step": 100, "split": "validation", "time_s": 3.0},
      {"step": 100, "split": "train", "steps_per_second": None},  # no interval timed
  ]
  assert metrics_writer.elapsed_seconds(records) == pytest.approx(38.0)
  records.append({"step": 150, "split": "train", "elapsed_s": 50.0})
  assert metrics_writer.elapsed_seconds(records) == 50.0
  assert metrics_writer.elapsed_seconds([]) == 0.0


def test_starts_are_appended_in_order(tmp_path):
  metrics_writer.record_start(str(tmp_path), 0, "abc1234")
  metrics_writer.record_start(str(tmp_path), 500, "def5678-dirty")
  starts = metrics_writer.read_starts(str(tmp_path))
  assert [(s["step"], s["commit"]) for s in starts] == [(0, "abc1234"), (500, "def5678-dirty")]
  assert all(s["started_at"].endswith("Z") and s["host"] for s in starts)
  assert not any("variant_code" in s for s in starts)  # relpos's own variant: nothing to name
  code = {"file": "/x/kerple.py", "sha256": "ab" * 32}
  metrics_writer.record_start(str(tmp_path), 600, "def5678", code)
  assert metrics_writer.read_starts(str(tmp_path))[-1]["variant_code"] == code
  assert metrics_writer.read_starts(str(tmp_path / "nowhere")) == []


def test_a_tokenizer_other_than_the_recorded_one_is_refused(tmp_path):
  workdir = str(tmp_path)
  metrics_writer.check_tokenizer(workdir, "a" * 64, "t.model")  # no start yet
  metrics_writer.record_start(workdir, 0, "abc1234")  # started before tokenizers were recorded
  metrics_writer.check_tokenizer(workdir, "a" * 64, "t.model")
  metrics_writer.record_start(workdir, 100, "abc1234", tokenizer_sha256="a" * 64)
  assert metrics_writer.read_starts(workdir)[-1]["tokenizer_sha256"] == "a" * 64
  metrics_writer.check_tokenizer(workdir, "a" * 64, "t.model")
  with pytest.raises(ValueError) as raised:
    metrics_writer.check_tokenizer(workdir, "b" * 64, "/data/t.model")
  assert str(raised.value) == (
      f"the tokenizer /data/t.model (sha256 bbbbbbbbbbbb) is not the one the checkpoints in "
      f"{workdir} were trained with (sha256 aaaaaaaaaaaa, starts.jsonl): its ids mean other "
      f"pieces. Point task.tfds_data_dir (or $RELPOS_DATA_DIR) at the data folder the run was "
      f"trained with, or train in a new --workdir.")


def test_starts_record_the_machine_and_train_records_the_load(tmp_path):
  metrics_writer.record_start(str(tmp_path), 0, "abc1234")
  start = metrics_writer.read_starts(str(tmp_path))[0]
  assert start["cpus"] == metrics_writer.usable_cpus() >= 1
  assert (start["host_cpu"], start["device_kind"]) == (metrics_writer.host_cpu(), "cpu")
  load = metrics_writer.load_average()
  assert load is None or load >= 0.0


def test_machine_load_counts_records_above_their_starts_cores():
  starts = [{"step": 0}, {"step": 200, "cpus": 2}, {"step": 400, "cpus": 16}]
  train = lambda step, load: {
      "step": step, "split": "train", "steps_per_second": 1.0, "load_average": load
  }
  records = [
      train(100, 1.0),  # its start (step 0) predates "cpus": unrecorded
      train(200, 1.5),  # still the first start's: a record ends the steps before it
      train(300, 1.5),
      train(350, 3.5),  # above 2 cores + 1: loaded
      {"step": 350, "split": "validation", "bleu": 30.0},
      train(400, None),  # written before load_average: unrecorded
      train(500, 3.5),  # 16 cores: alone
      {"step": 600, "split": "train", "steps_per_second": None, "load_average": 9.0},  # untimed
  ]
  assert metrics_writer.machine_load(records, starts) == {
      "median_load_average": 3.5, "cpus": 16, "loaded_share": 1 / 6, "unrecorded_share": 3 / 6
  }
  assert metrics_writer.machine_load([], []) == {
      "median_load_average": None, "cpus": None, "loaded_share": None, "unrecorded_share": None
  }


def test_timing_fields_are_all_that_differs_between_two_executions():
  record = {
      "step": 1, "split": "train", "loss": 2.0, "steps_per_second": 3.0, "elapsed_s": 4.0,
      "load_average": 1.5
  }
  assert metrics_writer.without_timing([record]) == [{"step": 1, "split": "train", "loss": 2.0}]


def test_writer_drops_records_past_the_resume_step_and_writes_strict_json(tmp_path):
  with metrics_writer.MetricsWriter(str(tmp_path), resume_step=0) as writer:
    for step in (1, 2, 3):
      writer.write(step, "train", {"loss": float(step)})
  with metrics_writer.MetricsWriter(str(tmp_path), resume_step=2) as writer:
    writer.write(3, "train", {"loss": float("nan")})
  lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
  assert [json.loads(line) for line in lines] == [{"step": 1, "split": "train", "loss": 1.0},
                                                  {"step": 2, "split": "train", "loss": 2.0},
                                                  {"step": 3, "split": "train", "loss": None}]


def _tensorboard_purges(workdir) -> list[int]:
  """The steps of the SessionLog START events in workdir/tensorboard (TensorBoard drops the
  points an earlier start logged at or past each), read from the TFRecord event files."""
  from tensorboardX.proto import event_pb2  # pylint: disable=import-outside-toplevel
  steps = []
  for path in sorted((workdir / "tensorboard").iterdir()):
    data = path.read_bytes()
    while data:
      length = int.from_bytes(data[:8], "little")  # then a CRC of 4 bytes
      event = event_pb2.Event.FromString(data[12:12 + length])
      data = data[12 + length + 4:]
      if event.HasField("session_log") and event.session_log.status == event.session_log.START:
        steps.append(event.step)
  return steps


def test_tensorboard_drops_what_an_earlier_start_logged_past_the_resume_step(tmp_path):
  """A start that saved no checkpoint, then one from step 0: metrics.jsonl keeps nothing of the
  first, and neither does TensorBoard (it drew the first's points twice)."""
  for resume_step in (0, 0, 2):
    time.sleep(1.1)  # an event file is named by the second it was opened in
    with metrics_writer.MetricsWriter(str(tmp_path), resume_step=resume_step) as writer:
      writer.write(resume_step + 1, "train", {"loss": 1.0})
  assert sorted(_tensorboard_purges(tmp_path)) == [1, 1, 3]


def test_a_start_killed_while_dropping_records_keeps_the_history(tmp_path, monkeypatch):
  with metrics_writer.MetricsWriter(str(tmp_path), resume_step=0) as writer:
    for step in (1, 2, 3):
      writer.write(step, "train", {"loss": float(step)})
  before = (tmp_path / "metrics.jsonl").read_text()

  def killed(*_):
    raise KeyboardInterrupt  # as a signal arriving between writing and renaming

  monkeypatch.setattr(metrics_writer.json_files.os, "replace", killed)
  with pytest.raises(KeyboardInterrupt):
    metrics_writer.MetricsWriter(str(tmp_path), resume_step=2)
  assert (tmp_path / "metrics.jsonl").read_text() == before
  assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl", "tensorboard"]


def test_host_cpu_names_the_model_and_the_vector_instruction_sets(tmp_path, monkeypatch):
  cpuinfo = tmp_path / "cpuinfo"
  cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC 9654\nflags\t\t: fpu sse2 avx2 fma "
                     "avx512f avx512_bf16\n\nprocessor\t: 1\nmodel name\t: AMD EPYC 9654\n")
  assert metrics_writer.host_cpu(str(cpuinfo)) == "AMD EPYC 9654 (avx2, fma, avx512f, avx512_bf16)"
  cpuinfo.write_text("processor\t: 0\nmodel name\t: Neoverse-V2\nflags\t\t: fp asimd sve2\n")
  assert metrics_writer.host_cpu(str(cpuinfo)) == "Neoverse-V2"
  monkeypatch.setattr(metrics_writer.platform, "machine", lambda: "arm64")
  assert metrics_writer.host_cpu(str(tmp_path / "none")) == "arm64"  # no /proc/cpuinfo (macOS)
