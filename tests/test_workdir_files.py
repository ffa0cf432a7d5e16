"""Tests for relpos.workdir_files: the names of a workdir's files."""
from relpos import workdir_files

NAMES = [value for name, value in vars(workdir_files).items() if name.isupper()]


def test_every_name_is_distinct_and_lies_in_the_workdir():
  assert len(NAMES) == len(set(NAMES)) == 8
  assert all(name and "/" not in name and not name.startswith(".") for name in NAMES)


def test_the_module_docstring_describes_every_name():
  assert all(name in workdir_files.__doc__ for name in NAMES)
