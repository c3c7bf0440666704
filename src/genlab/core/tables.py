"""The one markdown table writer: sweep and suite reports, `genlab bench`, analyze, eval and the config reference
all write their tables with `markdown_table`, and so do the benchmark scripts."""
from __future__ import annotations

import re

# a number as genlab prints one: 12, -0.5, 1.2e-05, 12.3%, 1.10x, 4.56 M, 3.2 ms; "a ± b" of two of them
_NUM = r"[-+]?(\d[\d,]*(\.\d*)?|\.\d+)(e[-+]?\d+)?(%|x| ?[kMB]| ?m?s)?"
NUMBER = re.compile(rf"{_NUM}( ± {_NUM})?")
BLANK = {"", "-", "n/a", "inf", "nan"}  # say nothing about a column's kind


def numeric(cells) -> bool:
    """A column of numbers (blank cells aside, at least one number): right-aligned, so digits line up."""
    seen = [c.strip() for c in cells if c.strip() not in BLANK]
    return bool(seen) and all(NUMBER.fullmatch(c) for c in seen)


def markdown_table(head, rows, align: str | None = None) -> str:
    """`head` (the column names) over `rows` (one list of cells each; str() of each cell) as a markdown table, one
    line a row, no trailing newline. `align`: "l" or "r" per column; by default numeric columns are right-aligned."""
    rows = [[str(c) for c in r] for r in rows]
    if align is None:
        align = "".join("r" if numeric(r[i] for r in rows if i < len(r)) else "l" for i in range(len(head)))
    rule = ["---:" if a == "r" else "---" for a in align]
    return "\n".join(markdown_row(r) for r in [head, rule, *rows])


def markdown_row(cells) -> str:
    """One row; a script that prints rows as they are measured prints markdown_table(head, [], align) first."""
    return "| " + " | ".join(map(str, cells)) + " |"
