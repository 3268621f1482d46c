"""The report's tables as plain data, and the ways to print them.

A :class:`Table` is a title, column names and rows of strings; the report builds its tables
once (``Report.tables``) and a renderer prints them: ``rich`` on a terminal (``--format
table``, the default), GitHub-flavoured Markdown (``--format markdown``), or CSV (``--format
csv``: each table a block of rows, its title the first row's only cell, blocks separated by
an empty line; numbers plain, in seconds, bytes and FLOPs, the unit in the column's name). Off a terminal (a file, a CI log, ``less``) the rich console is as wide as
the widest line, so no cell is cut (on a terminal, cells wrap at its width).

>>> t = Table("Bounds", ["arch", "time"], [["h100-sxm", "1.2 ms"]], left={0})
>>> print(markdown([t]))
### Bounds
<BLANKLINE>
| arch | time |
|:---|---:|
| h100-sxm | 1.2 ms |
<BLANKLINE>
>>> print(csv_text([t]), end="")
Bounds
arch,time
h100-sxm,1.2 ms
"""

from __future__ import annotations

import csv
import io
import sys
from dataclasses import dataclass, field

FORMATS = ("table", "markdown", "csv")


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]]
    left: set[int] = field(default_factory=set)    # left-aligned columns (others right)
    # the same table for machines (CSV): plain numbers in SI units, the unit in the header
    raw_columns: list[str] | None = None
    raw_rows: list[list] | None = None


def console(stderr: bool = False):
    """A rich console for the report: on a terminal its width; off one (a file, a pipe, a CI
    log) wide enough that tables print whole cells instead of cutting them at 80 columns."""
    from rich.console import Console
    stream = sys.stderr if stderr else sys.stdout
    tty = hasattr(stream, "isatty") and stream.isatty()
    return Console(emoji=False, highlight=False, stderr=stderr,
                   width=None if tty else 10_000, soft_wrap=not tty)


def rich_table(t: Table):
    from rich.markup import escape
    from rich.table import Table as RichTable
    rt = RichTable(title=escape(t.title))
    for i, c in enumerate(t.columns):
        rt.add_column(escape(c), justify="left" if i in t.left else "right")
    for r in t.rows:
        rt.add_row(*(escape(str(x)) for x in r))
    return rt


def print_tables(tables: list[Table], format: str = "table", console=None) -> None:
    """Print ``tables`` in ``format`` (``FORMATS``) to ``console`` (default
    :func:`console`, standard output)."""
    con = console or globals()["console"]()
    if format == "csv":
        con.file.write(csv_text(tables))
    elif format == "markdown":
        con.file.write(markdown(tables))
    else:
        for t in tables:
            con.print(rich_table(t))


def _md_cell(x) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def markdown(tables: list[Table]) -> str:
    out = []
    for t in tables:
        out.append(f"### {t.title}\n")
        out.append("| " + " | ".join(_md_cell(c) for c in t.columns) + " |")
        out.append("|" + "|".join(":---" if i in t.left else "---:"
                                  for i in range(len(t.columns))) + "|")
        for r in t.rows:
            out.append("| " + " | ".join(_md_cell(x) for x in r) + " |")
        out.append("")
    return "\n".join(out)


def csv_text(tables: list[Table]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    for n, t in enumerate(tables):
        if n:
            buf.write("\n")
        w.writerow([t.title])
        if t.raw_rows is not None:
            w.writerow(t.raw_columns)
            w.writerows([["" if x is None else x for x in r] for r in t.raw_rows])
        else:
            w.writerow(t.columns)
            w.writerows([[str(x) for x in r] for r in t.rows])
    return buf.getvalue()
