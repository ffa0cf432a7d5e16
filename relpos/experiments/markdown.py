"""Markdown and numbers as table.md writes them, for its sections (`relpos.experiments.report`,
`relpos.experiments.report_runs`) and the runner's progress lines."""


def table(header: list[str], rows: list[list[str]]) -> list[str]:
  """A markdown table's lines: `header`, its separator, then one line per row of cells."""
  return ["| " + " | ".join(cells) + " |" for cells in [header, ["---"] * len(header), *rows]]


def duration(seconds: float) -> str:
  """"1 h 02 min", "12 min", "40 s"."""
  if seconds >= 3600:
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"
  return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"
