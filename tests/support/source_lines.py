"""Where a test's own source says something: the `path:line` a captured op's `source` names."""

from __future__ import annotations

from pathlib import Path


def marked_line(path: Path, marker: str) -> str:
    """`path:line` of the one line of `path` that ends with the comment `marker`."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found = [i + 1 for i, text in enumerate(lines) if text.rstrip().endswith(f"# {marker}")]
    assert len(found) == 1, marker
    return f"{path}:{found[0]}"
