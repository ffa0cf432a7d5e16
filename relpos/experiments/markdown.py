"""Markdown and numbers as table.md writes them, for its sections (`relpos.experiments.report`,
`relpos.experiments.report_runs`) and the runner's progress lines."""


def table(header: list[str], rows: list[list[str]]) -> list[str]:
  """A markdown table's lines: `header`, its separator, then one line per row of cells."""
  return ["| " + " | ".join(cells) + " |" for cells in [header, ["---"] * len(header), *rows]]


def duration(seconds: float) -> str:
  """"1 h 02 min", "12 min", "40 s": rounded to the nearest minute from one minute on."""
  if seconds < 59.5:
    return f"{seconds:.0f} s"
  minutes = round(seconds / 60)
  return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"
