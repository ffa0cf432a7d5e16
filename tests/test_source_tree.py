"""Tests for relpos.source_tree: its root and the commit a process loaded."""
import os
import re

from relpos import source_tree


def test_the_root_holds_relpos_and_configs():
  assert os.path.isdir(os.path.join(source_tree.ROOT, "relpos"))
  assert os.path.isdir(os.path.join(source_tree.ROOT, "configs"))


def test_the_source_commit_is_read_once_per_process(monkeypatch):
  """A table running in one process records the code it loaded, not what the tree holds when a
  later run starts."""
  source_tree.commit.cache_clear()
  first = source_tree.commit()
  assert first == "unknown" or re.fullmatch(r"[0-9a-f]{7,}(-dirty)?", first)

  def tree_changed(*args, **kwargs):
    raise AssertionError("the tree was read again")

  monkeypatch.setattr(source_tree.subprocess, "run", tree_changed)
  assert source_tree.commit() == first
