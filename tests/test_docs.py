"""README.md and docs/: links and anchors resolve, commands name files that exist, the README's
results tables equal the committed tables they come from (tools/readme_tables.py), and
docs/layout.md names every module."""
import importlib
import pathlib
import re
import unicodedata

import pytest

from relpos.experiments import report
from tools import readme_tables

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)
# A repository path in a command: a top-level file or one under a source folder.
COMMAND_PATH = re.compile(
    r"(?<![\w./$-])((?:configs|examples|tools|benchmarks|relpos|tests|docs)/[\w./-]+\.\w+"
    r"|(?:train|eval)\.py|requirements\.txt)")
MODULE = re.compile(r"-m ((?:relpos|benchmarks|tools)(?:\.\w+)+)")


def _without_code(text: str) -> str:
  return FENCE.sub("", text)


def slug(heading: str) -> str:
  """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to '-'."""
  text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
  kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LMN")
  return kept.replace(" ", "-")


def anchors(page: pathlib.Path) -> set[str]:
  """Every heading anchor of a page, with GitHub's -1, -2 suffixes for repeated headings."""
  seen: dict[str, int] = {}
  result = set()
  for heading in HEADING.findall(_without_code(page.read_text(encoding="utf-8"))):
    base = slug(heading)
    count = seen.get(base, 0)
    seen[base] = count + 1
    result.add(base if count == 0 else f"{base}-{count}")
  return result


def _links(page: pathlib.Path) -> list[str]:
  return [
      link for link in LINK.findall(_without_code(page.read_text(encoding="utf-8")))
      if not re.match(r"[a-z]+:", link)
  ]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_and_anchors_resolve(page):
  broken = []
  for link in _links(page):
    path, _, anchor = link.partition("#")
    target = (page.parent / path).resolve() if path else page
    if not target.exists():
      broken.append(f"{link}: no file {target.relative_to(ROOT)}")
    elif anchor and target.suffix == ".md" and anchor not in anchors(target):
      broken.append(f"{link}: no heading with anchor #{anchor} in {target.relative_to(ROOT)}")
  assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_slug_follows_github():
  assert slug("Multi30K en-de: the recipe on CPU") == "multi30k-en-de-the-recipe-on-cpu"
  assert slug("Synthetic task: the k sweep (Table 2)") == "synthetic-task-the-k-sweep-table-2"
  assert slug("`rel_kv` on an H200, 1.1x") == "rel_kv-on-an-h200-11x"


def _readme_commands() -> str:
  text = (ROOT / "README.md").read_text(encoding="utf-8")
  return "\n".join(block for block in FENCE.findall(text) if block.startswith("```bash"))


def test_readme_commands_name_files_that_exist():
  commands = _readme_commands()
  paths = set(COMMAND_PATH.findall(commands))
  modules = set(MODULE.findall(commands))
  assert {"configs/ablation.py", "examples/kerple.py", "train.py"} <= paths
  assert "relpos.experiments.run" in modules
  missing = sorted(p for p in paths if not (ROOT / p).is_file())
  missing += sorted(m for m in modules if not (ROOT / (m.replace(".", "/") + ".py")).is_file())
  assert not missing


@pytest.mark.parametrize("page", readme_tables.DEFAULT_FILES)
def test_results_tables_equal_their_sources(page):
  text = (ROOT / page).read_text(encoding="utf-8")
  assert readme_tables.BLOCK.findall(text)
  assert readme_tables.rebuild(text) == text, "run `python -m tools.readme_tables`"


def test_table_selection_and_transpose(tmp_path, monkeypatch):
  (tmp_path / "t.md").write_text(
      "# t\n\n## a\n\n| row | x | y |\n| --- | --- | --- |\n"
      "| r1 | 1 | 2 |\n| r2 | 3 | 4 |\n", encoding="utf-8")
  monkeypatch.setattr(readme_tables, "ROOT", str(tmp_path))
  marked = ('<!-- table: t.md section=a rows="r2" columns="row|y" transpose -->\n'
            "old\n<!-- /table -->")
  assert readme_tables.rebuild(marked) == marked.replace(
      "old\n", "| row | r2 |\n| --- | --- |\n| y | 4 |\n")
  with pytest.raises(ValueError, match="no column 'z'"):
    readme_tables.rebuild(marked.replace("row|y", "row|z"))


def test_nth_table_of_a_section_and_renamed_headers(tmp_path, monkeypatch):
  (tmp_path / "t.md").write_text(
      "## a\n\n| row | x |\n| --- | --- |\n| r1 | 1 |\n\nthen\n\n| row | y |\n| --- | --- |\n"
      "| r1 | 2 |\n", encoding="utf-8")
  monkeypatch.setattr(readme_tables, "ROOT", str(tmp_path))
  marked = '<!-- table: t.md section=a nth=2 headers="name|value" -->\nold\n<!-- /table -->'
  assert readme_tables.rebuild(marked) == marked.replace(
      "old\n", "| name | value |\n| --- | --- |\n| r1 | 2 |\n")
  with pytest.raises(ValueError, match="t.md: no table 3 after heading 'a'"):
    readme_tables.rebuild(marked.replace("nth=2", "nth=3"))
  with pytest.raises(ValueError, match="t.md: 1 headers for 2 columns"):
    readme_tables.rebuild(marked.replace("name|value", "name"))
  with pytest.raises(ValueError, match="unknown option 'nth=0'"):
    readme_tables.rebuild(marked.replace("nth=2", "nth=0"))


@pytest.mark.parametrize(
    "folder", sorted(p.parent.name for p in (ROOT / "docs" / "results").glob("*/results.json")))
def test_committed_tables_rebuild_from_their_results(folder, tmp_path):
  """Every committed table.md is what the report writes from its results.json today."""
  results = ROOT / "docs" / "results" / folder
  report.write_table(str(results / "results.json"), str(tmp_path / "table.md"))
  assert ((tmp_path / "table.md").read_text(encoding="utf-8") == (results / "table.md").read_text(
      encoding="utf-8")), (f"rebuild {results}/table.md: relpos.experiments.report.write_table")


def _modules() -> list[pathlib.Path]:
  """Every module of the library, the benchmarks and the tools (not package __init__ files)."""
  return [
      path for folder in ("relpos", "benchmarks", "tools")
      for path in sorted((ROOT / folder).rglob("*.py")) if path.name != "__init__.py"
  ]


def test_layout_page_names_every_module_and_no_other():
  text = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
  named = set(re.findall(r"\b(\w+\.py)\b", text))
  variants = re.search(r"variant: ([\w, ]+)", text).group(1).split(", ")
  missing = [
      str(path.relative_to(ROOT))
      for path in _modules()
      if path.name not in named and not (path.parent.name == "variants" and path.stem in variants)
  ]
  assert not missing, "docs/layout.md does not name " + ", ".join(missing)
  existing = {path.name for path in _modules()} | {"train.py", "eval.py"}
  existing |= {
      path.name for folder in ("configs", "examples") for path in (ROOT / folder).glob("*.py")
  }
  assert not named - existing, f"docs/layout.md names no longer existing {named - existing}"


# A name of relpos's code in backticks, e.g. `relpos.evaluation_files.output_name`.
CODE_NAME = re.compile(r"`(relpos(?:\.[A-Za-z_]\w*)+)")


def _resolves(name: str) -> bool:
  """Whether a dotted name is a module of relpos, or an attribute (of an attribute ...) of one."""
  parts = name.split(".")
  for split in range(len(parts), 0, -1):
    try:
      found = importlib.import_module(".".join(parts[:split]))
    except ImportError:
      continue
    for attribute in parts[split:]:
      if not hasattr(found, attribute):
        return False
      found = getattr(found, attribute)
    return True
  return False


def test_code_names_in_pages_and_docstrings_exist():
  """A module or function renamed leaves no page or docstring naming the old one."""
  sources = PAGES + [
      path for folder in ("relpos", "benchmarks", "tools", "configs", "examples")
      for path in (ROOT / folder).rglob("*.py")
  ] + [ROOT / "train.py", ROOT / "eval.py"]
  names = {(name, str(path.relative_to(ROOT)))
           for path in sources
           for name in CODE_NAME.findall(path.read_text(encoding="utf-8"))}
  assert len(names) > 50
  missing = sorted(f"{path}: {name}" for name, path in names if not _resolves(name))
  assert not missing, "names of no module or attribute: " + ", ".join(missing)
