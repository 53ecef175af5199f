"""How problems name a file's parts, and an error's words, for a user."""

from __future__ import annotations


def first_line(exc: BaseException) -> str:
    """The first line of an error's message (its type's name when it has none), at most 300 characters."""
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


def where(label: str, key_path: tuple[str, ...]) -> str:
    """A tensor inside a file, as problems name it: `file.pt[layer][0]`."""
    return f"{label}[{']['.join(key_path)}]" if key_path else label
