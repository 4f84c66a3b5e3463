"""One writer of Markdown tables, for every table raystream prints or writes (the report, matched drift, the map,
its predictions): a header row, the `---` separator, one row per line, cells as given. Plain Python, no imports."""

from __future__ import annotations

from typing import Iterable, Sequence


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """`header` and `rows` (their cells already formatted) as Markdown table lines joined by newlines, with no
    newline after the last."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines)
