"""Rebuilds the results tables of the README, docs/results.md and docs/length.md from the
committed tables they come from (a table's table.md), so that no number there is copied by hand.

  python -m tools.readme_tables [--check] [FILE ...]   (default FILE: those three)

A generated table sits between two HTML comments that name its source and selection:

  <!-- table: docs/results/synthetic_k_sweep/table.md section="k_sweep" rows="k=0|k=1"
       columns="row|test BLEU|paper" transpose -->
  | ... the generated table ... |
  <!-- /table -->

(the opening comment may span lines). The source is a Markdown file, relative to the repository
root; `section` names the heading under which its table is the first one (default: the file's
first table), `nth=N` takes the Nth table there instead; `rows` keeps the rows whose first cell
is named, in that order (default: all); `columns` keeps the columns whose header is named, in
that order (default: all); `headers` renames the kept columns (as many names as columns);
`transpose` swaps rows and columns after the selection. Without `--check` every block is
rewritten from its source; with it nothing is written and the exit status is 1 when a block
differs.
"""

import argparse
import os
import re
import shlex
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCK = re.compile(r"^<!-- table: (?P<spec>.*?) -->\n(?P<body>.*?)^<!-- /table -->$",
                   re.MULTILINE | re.DOTALL)
HEADING = re.compile(r"^#+\s+(.*?)\s*$")
DEFAULT_FILES = ("README.md", "docs/results.md", "docs/length.md")


def parse_spec(spec: str) -> dict:
  """The source path and selection of an opening comment."""
  words = shlex.split(spec)
  if not words:
    raise ValueError("a table marker names no source file.")
  selection = {
      "path": words[0], "section": None, "nth": 1, "rows": None, "columns": None, "headers": None,
      "transpose": False
  }
  for word in words[1:]:
    key, equals, value = word.partition("=")
    if key == "transpose" and not equals:
      selection["transpose"] = True
    elif key == "section" and equals:
      selection["section"] = value
    elif key in ("rows", "columns", "headers") and equals:
      selection[key] = value.split("|")
    elif key == "nth" and equals and value.isdigit() and int(value) >= 1:
      selection["nth"] = int(value)
    else:
      raise ValueError(f"table marker of {words[0]}: unknown option {word!r}.")
  return selection


def _cells(line: str) -> list[str]:
  return [cell.strip() for cell in line.strip().strip("|").split("|")]


def read_table(path: str, section: str | None, nth: int = 1) -> list[list[str]]:
  """The header and body rows of the `nth` table in `path` (after heading `section`)."""
  with open(os.path.join(ROOT, path), encoding="utf-8") as f:
    lines = f.read().splitlines()
  start = 0
  if section is not None:
    headings = [
        i for i, line in enumerate(lines) if (m := HEADING.match(line)) and m.group(1) == section
    ]
    if not headings:
      raise ValueError(f"{path}: no heading {section!r}.")
    start = headings[0] + 1
  found = 0
  for i in range(start, len(lines) - 1):
    if lines[i].startswith("|") and re.fullmatch(r"\|( *:?-+:? *\|)+", lines[i + 1].strip()):
      found += 1
      if found < nth:
        continue
      rows = [_cells(lines[i])]
      for line in lines[i + 2:]:
        if not line.startswith("|"):
          break
        rows.append(_cells(line))
      return rows
  where = f" after heading {section!r}" if section else ""
  raise ValueError(f"{path}: no table {nth}{where}." if nth > 1 else f"{path}: no table{where}.")


def select(table: list[list[str]], selection: dict) -> list[list[str]]:
  """The rows and columns a marker names, transposed if it says so."""
  header, body = table[0], table[1:]
  path = selection["path"]
  if selection["columns"] is not None:
    missing = [c for c in selection["columns"] if c not in header]
    if missing:
      raise ValueError(f"{path}: no column {missing[0]!r} (columns: {', '.join(header)}).")
    keep = [header.index(c) for c in selection["columns"]]
    header, body = [header[i] for i in keep], [[row[i] for i in keep] for row in body]
  if selection["rows"] is not None:
    by_name = {row[0]: row for row in body}
    missing = [r for r in selection["rows"] if r not in by_name]
    if missing:
      raise ValueError(f"{path}: no row {missing[0]!r}.")
    body = [by_name[r] for r in selection["rows"]]
  if selection["headers"] is not None:
    if len(selection["headers"]) != len(header):
      raise ValueError(f"{path}: {len(selection['headers'])} headers for {len(header)} columns.")
    header = selection["headers"]
  rows = [header] + body
  if selection["transpose"]:
    rows = [list(column) for column in zip(*rows)]
  return rows


def render(rows: list[list[str]]) -> str:
  lines = ["| " + " | ".join(rows[0]) + " |", "|" + " --- |" * len(rows[0])]
  lines += ["| " + " | ".join(row) + " |" for row in rows[1:]]
  return "\n".join(lines) + "\n"


def rebuild(text: str) -> str:
  """`text` with every marked table generated from its source."""
  def replace(match: re.Match) -> str:
    selection = parse_spec(match.group("spec"))
    table = read_table(selection["path"], selection["section"], selection["nth"])
    body = render(select(table, selection))
    return f"<!-- table: {match.group('spec')} -->\n{body}<!-- /table -->"

  return BLOCK.sub(replace, text)


def main(argv: list[str]) -> int:
  parser = argparse.ArgumentParser(prog="python -m tools.readme_tables",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("files", nargs="*", default=list(DEFAULT_FILES),
                      help="Markdown files to rebuild, relative to the repository root")
  parser.add_argument("--check", action="store_true",
                      help="write nothing; exit 1 when a table differs from its source")
  args = parser.parse_args(argv)
  stale = []
  for name in args.files:
    path = os.path.join(ROOT, name)
    with open(path, encoding="utf-8") as f:
      text = f.read()
    try:
      new = rebuild(text)
    except ValueError as e:
      print(f"{name}: {e}", file=sys.stderr)
      return 2
    if new != text:
      stale.append(name)
      if not args.check:
        with open(path, "w", encoding="utf-8") as f:
          f.write(new)
  if args.check and stale:
    print(
        f"tables differ from their sources in {', '.join(stale)}; run "
        "`python -m tools.readme_tables` to rebuild them.", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
