"""Tests for tools/job_output.py: what a GPU job gives back (a run's progress, an archive that
fits, a log cut to its head and tail, the host's limits)."""
import os
import tarfile

import pytest

from tools import job_output


def test_run_progress_reads_the_last_progress_bar_of_a_run_log(tmp_path):
  log = tmp_path / "run.log"
  log.write_bytes(b"\r  0%|   | 0/8000 [00:00<?, ?step/s]\r 68%|###   | 5434/8000 [07:15<03:25, "
                  b"12.45step/s]\r 68%|###   | 5435/8000 [07:16<03:25, 12.46step/s, loss=1.58]"
                  b"\nW1123 train.py:728] Preempted: saved step 5435\n")
  assert job_output.run_progress(str(log)) == "step 5435 of 8000, 12.46 steps/s"
  log.write_bytes(b"\r  0%|   | 1/8000 [00:42<93:23:06, 40.00s/step]\nerror: non-finite\n")
  assert job_output.run_progress(str(log)) == "step 1 of 8000, 0.025 steps/s"
  log.write_bytes(b"error: the config is wrong\n")
  assert job_output.run_progress(str(log)) is None
  assert job_output.run_progress(str(tmp_path / "missing.log")) is None


def test_write_archive_leaves_out_the_largest_files_until_it_fits(tmp_path):
  sizes = {"small.json": 1000, "large.bin": 200_000, "medium.bin": 50_000}
  for name, size in sizes.items():
    (tmp_path / name).write_bytes(os.urandom(size))
  archive = str(tmp_path / "out.tar.gz")
  left_out = job_output.write_archive([str(tmp_path / n) for n in sizes], str(tmp_path), archive,
                                      limit=100_000)
  assert left_out == ["large.bin"] and os.path.getsize(archive) <= 100_000
  with tarfile.open(archive) as f:
    assert sorted(f.getnames()) == ["medium.bin", "small.json"]


def test_trim_log_keeps_head_and_tail_within_the_limit(tmp_path):
  path = tmp_path / "job.log"
  path.write_bytes(b"head" + b"x" * 10_000 + b"tail")
  job_output.trim_log(str(path), limit=1000, head=100)
  data = path.read_bytes()
  assert len(data) == 1000 and data.startswith(b"head") and data.endswith(b"tail")
  assert b"bytes of log left out here" in data


@pytest.mark.parametrize("files, message", [
    ([f"f{i}" for i in range(9)], "9 files, over 8"),
    (["bad name.txt"], "only letters"),
    (["a/b/c/deep.txt"], "more than 2 folders"),
])
def test_check_returnable_names_what_would_not_come_back(tmp_path, files, message):
  for name in files:
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text("x")
  with pytest.raises(ValueError, match=message):
    job_output.check_returnable(str(tmp_path))


def test_check_returnable_refuses_a_file_over_16_mib(tmp_path):
  (tmp_path / "big.bin").write_bytes(b"\0" * (job_output.MAX_FILE_BYTES + 1))
  with pytest.raises(ValueError, match="big.bin: .* bytes, over"):
    job_output.check_returnable(str(tmp_path))
