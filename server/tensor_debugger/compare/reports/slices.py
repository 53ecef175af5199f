"""Lazy chunked slices: a window of one or two dimensions of a pair's aligned tensors, every other dimension
fixed. Only the stored chunks that intersect the window are read."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tensor_debugger.engine.elementwise import signed_diff
from tensor_debugger.engine.metrics import json_number
from tensor_debugger.engine.views import View
from tensor_debugger.errors import InvalidInputError

MAX_COUNT = 4096  # values along one free dimension
MAX_VALUES = 64 * 1024  # values in one window

# One value of a window: a number (an integer as such, a bool as 0 or 1), or "nan", "inf", "-inf". Not `int |
# float`: JSON Schema's oneOf of integer and number would match an integer twice, and so refuse it
SliceNumber = float | str
# A window's values, nested in its shape: a 0-d tensor's one value, a list for one free dimension, a list of lists
# for two; a complex value is [real, imag], one level deeper
SliceValues = SliceNumber | list[SliceNumber] | list[list[SliceNumber]] | list[list[list[SliceNumber]]]


@dataclass(frozen=True)
class SliceRequest:
    index: tuple[int | None, ...]  # a fixed index per dimension, None where the window runs
    start: tuple[int, ...]  # per free dimension
    count: tuple[int, ...]


def parse_slice_request(shape: tuple[int, ...], index: str, start: str, count: str) -> SliceRequest:
    """`index` like "3,:,0,:" (":" marks the one or two free dimensions), `start` and `count` one per free one."""
    parts = [p.strip() for p in index.split(",")] if index else []
    if len(parts) != len(shape):
        raise InvalidInputError(f"index needs {len(shape)} entries for shape {list(shape)}, got {index!r}")
    fixed: list[int | None] = []
    for dim, (part, size) in enumerate(zip(parts, shape, strict=True)):
        if part == ":":
            fixed.append(None)
            continue
        try:
            value = int(part)
        except ValueError:
            raise InvalidInputError(f"index entry {dim} is {part!r}: an integer or ':'") from None
        if not 0 <= value < size:
            raise InvalidInputError(f"index {value} is out of range for dimension {dim} of size {size}")
        fixed.append(value)
    free = [d for d, v in enumerate(fixed) if v is None]
    if len(free) > 2 or (shape and not free):
        raise InvalidInputError("mark one or two dimensions with ':' for the window")
    starts = _ints(start, len(free), "start", 0)
    counts = _ints(count, len(free), "count", 64)
    for dim, s, c in zip(free, starts, counts, strict=True):
        if not 0 <= s < max(shape[dim], 1) or not 1 <= c <= MAX_COUNT:
            raise InvalidInputError(
                f"window start {s} count {c} does not fit dimension {dim} of size {shape[dim]} "
                f"(count at most {MAX_COUNT})"
            )
    if math.prod(counts) > MAX_VALUES:
        raise InvalidInputError(f"a window holds at most {MAX_VALUES} values")
    return SliceRequest(tuple(fixed), tuple(starts), tuple(counts))


def _ints(text: str, n: int, what: str, default: int) -> list[int]:
    if not text:
        return [default] * n
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise InvalidInputError(f"{what} must be integers separated by commas, got {text!r}") from None
    if len(values) != n:
        raise InvalidInputError(f"{what} needs {n} values, got {text!r}")
    return values


@dataclass(frozen=True)
class Window:
    """Values of both runs in a window, in the window's own shape (one or two dims), and where it lies."""

    request: SliceRequest
    region: tuple[slice, ...]  # in aligned coordinates
    a: NDArray[Any]
    b: NDArray[Any]
    diff: NDArray[Any]  # b - a, float64 (complex128 for complex values): engine/elementwise.py's signed_diff

    def index_of(self, position: tuple[int, ...]) -> tuple[int, ...]:
        """The aligned index of a position inside the window."""
        free = iter(position)
        return tuple(
            r.start + next(free) if f is None else f for r, f in zip(self.region, self.request.index, strict=True)
        )


def read_window(a: View, b: View, request: SliceRequest) -> Window:
    shape = a.shape
    region: list[slice] = []
    free = iter(zip(request.start, request.count, strict=True))
    for dim, fixed in enumerate(request.index):
        if fixed is None:
            s, c = next(free)
            region.append(slice(s, min(s + c, shape[dim])))
        else:
            region.append(slice(fixed, fixed + 1))
    box = tuple(region)
    out_shape = tuple(r.stop - r.start for r, f in zip(box, request.index, strict=True) if f is None)
    values_a = a.read(box).reshape(out_shape)
    values_b = b.read(box).reshape(out_shape)
    return Window(request, box, values_a, values_b, signed_diff(values_a, values_b))


@dataclass(frozen=True)
class WindowDim:
    dim: int  # an aligned dimension the window runs along
    start: int
    count: int


@dataclass(frozen=True)
class SliceReport:
    """Values of both runs and their difference (candidate - reference) in a window of the aligned tensors:
    nested lists in the window's shape; NaN and infinities as "nan", "inf", "-inf"; complex values as
    [real, imag]."""

    shape: list[int]  # the aligned shape
    index: list[int | str]  # a fixed index per dimension, ":" where the window runs
    window: list[WindowDim]
    a: SliceValues
    b: SliceValues
    diff: SliceValues


def read_slice(a: View, b: View, request: SliceRequest) -> SliceReport:
    window = read_window(a, b, request)
    return SliceReport(
        shape=list(a.shape),
        index=[v if v is not None else ":" for v in request.index],
        window=[
            WindowDim(d, r.start, r.stop - r.start)
            for d, (r, f) in enumerate(zip(window.region, request.index, strict=True))
            if f is None
        ],
        a=_values(window.a),
        b=_values(window.b),
        diff=_values(window.diff),
    )


def _values(array: NDArray[Any]) -> SliceValues:
    """Nested lists; NaN and infinities as "nan", "inf", "-inf"; complex values as [real, imag]."""
    if array.dtype.kind == "c":
        return _values(np.stack([array.real, array.imag], axis=-1))
    if array.dtype.kind in "biu":
        exact: SliceValues = array.astype(int).tolist() if array.dtype.kind == "b" else array.tolist()
        return exact
    wide = array.astype(np.float64)
    as_list: SliceValues = wide.tolist()
    if np.isfinite(wide).all():  # the common case: nothing to replace, no walk over every element
        return as_list
    cleaned: SliceValues = _clean(as_list)
    return cleaned


def _clean(value: Any) -> Any:
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return json_number(value) if isinstance(value, float) else value
