"""Tests for relpos.experiments.paper: the paper's figures beside the tables are the paper's
(read from ../shared/reference/shaw2018.md where it is present, outside the repository) and
cover the rows and the k grid the tables run."""

import pathlib
import re

import pytest

from relpos.experiments import paper
from relpos.experiments import tables

SHARED_PAPER = pathlib.Path(__file__).resolve().parents[2] / "shared/reference/shaw2018.md"


def _table_rows(text: str, header: str) -> list[list[str]]:
  """The cells of the Markdown table whose header row starts with `header`: the header row,
  then the body rows (the separator row left out)."""
  lines = text.splitlines()
  start = next(i for i, line in enumerate(lines) if line.startswith(header))
  table = lines[start:start + 1]
  for line in lines[start + 2:]:
    if not line.startswith("|"):
      break
    table.append(line)
  return [[cell.strip() for cell in line.strip("|").split("|")] for line in table]


def test_figures_are_the_papers():
  if not SHARED_PAPER.exists():
    pytest.skip(f"{SHARED_PAPER} not present (outside the repository)")
  text = SHARED_PAPER.read_text()
  table1 = {(m, p): float(de) for m, p, de, _ in _table_rows(text, "| model | position")[1:]}
  header, k_row = _table_rows(text, "| k |")
  grid = [int(k) for k in header[1:]]
  table3 = {(v, k): float(b) for v, k, b in _table_rows(text, "| a^V | a^K |")[1:]}
  assert paper.ABLATION_FIGURES["abs"][0] == table1[("base", "absolute")]
  assert paper.ABLATION_FIGURES["rel_kv"][0] == table3[("yes", "yes")]
  assert paper.ABLATION_FIGURES["rel_k"][0] == table3[("no", "yes")]
  assert paper.ABLATION_FIGURES["rel_v"][0] == table3[("yes", "no")]
  assert paper.ABLATION_FIGURES["none"][0] == table3[("no", "no")]
  assert f"rel_kv {table1[('base', 'relative')]} there" in paper.ABLATION_FIGURES["abs"][1]
  assert paper.K_SWEEP_FIGURES == dict(zip(grid, map(float, k_row[1:])))
  drop = re.search(r"Speed: a (\d+)% drop in steps per second", text)
  assert paper.SPEED_DROP == pytest.approx(int(drop.group(1)) / 100)


def test_the_tables_run_the_papers_k_grid_and_rows():
  assert tuple(paper.K_SWEEP_FIGURES) == tables.K_GRID
  assert set(paper.ABLATION_FIGURES) <= set(tables.TABLES["ablation"])
