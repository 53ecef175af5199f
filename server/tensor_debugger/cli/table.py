"""The command line's one table printer: rows of text in columns, each as wide as its widest cell."""

from __future__ import annotations

from collections.abc import Sequence


def print_rows(rows: Sequence[Sequence[str]], indent: str = "") -> None:
    """`rows` (the first the header), two spaces between columns, trailing blanks cut; each line after `indent`."""
    if not rows:
        return
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print(indent + "  ".join(text.ljust(w) for text, w in zip(row, widths, strict=True)).rstrip())
