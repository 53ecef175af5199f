"""Where a test's own source says something: the `path:line` a captured op's `source` names."""

from __future__ import annotations

from pathlib import Path


def marked_line(path: Path, marker: str) -> str:
    """`path:line` of the one line of `path` that ends with the comment `marker`."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found = [i + 1 for i, text in enumerate(lines) if text.rstrip().endswith(f"# {marker}")]
    assert len(found) == 1, marker
    return f"{path}:{found[0]}"


def line_holding(path: Path, needle: str, first: bool = False) -> str:
    """`path:line` of the one line of `path` holding `needle` (with `first`, the first of several); the test is
    skipped where none does (a case written against a newer release's source than the one installed)."""
    import pytest

    found = [i + 1 for i, text in enumerate(path.read_text(encoding="utf-8").splitlines()) if needle in text]
    if not found:
        pytest.skip(f"{path.name} of this transformers release has no {needle!r}")
    assert len(found) == 1 or first, (path, needle, found)
    return f"{path}:{found[0]}"
