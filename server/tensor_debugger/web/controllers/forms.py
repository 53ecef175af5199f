"""What the pages' no-script HTML forms post: their fields as one flat mapping of strings."""

from __future__ import annotations

from typing import TypeAlias

from litestar.params import URLEncodedBody

from tensor_debugger.errors import InvalidInputError

FormData = dict[str, str]
Form: TypeAlias = URLEncodedBody[FormData]  # a handler's `data: Form`: a plain HTML form's fields


def optional_float(text: str | None, name: str) -> float | None:
    """A form's number field; empty: None."""
    if text is None or not text.strip():
        return None
    try:
        return float(text)
    except ValueError:
        raise InvalidInputError(f"{name} must be a number, got {text!r}") from None
