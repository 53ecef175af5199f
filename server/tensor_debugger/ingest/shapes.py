"""A tensor's shape as a file declares it, checked before anything is sized by it: whole sizes, none negative, at most
64 dimensions (numpy's limit, which the stored arrays and every reader here share)."""

from __future__ import annotations

import reprlib
from collections.abc import Sequence

MAX_DIMS = 64


class BadShape(ValueError):  # noqa: N818 (reads as the refusal it is)
    """A declared shape no tensor can have."""


def check_shape(shape: Sequence[object]) -> tuple[int, ...]:
    """`shape` as a tuple of sizes; BadShape for a negative or non-integer size or more than MAX_DIMS dimensions."""
    if len(shape) > MAX_DIMS:
        raise BadShape(f"a tensor of {len(shape)} dimensions, past the {MAX_DIMS} a stored array may have")
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise BadShape(f"a tensor of shape {reprlib.repr(tuple(shape))}: sizes must be whole numbers, 0 or more")
    return tuple(int(d) for d in shape)  # type: ignore[call-overload]
