"""Lazy views of stored tensors: reading a region of an aligned tensor reads only the stored chunks it needs.

Regions are tuples of slices with step 1, one per dimension. Every view can also say where an index of its own
lies in the stored tensors (`locate`): which shard, and the index inside it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from tensor_debugger.engine.alignment import Shape, Step
from tensor_debugger.engine.chunking import Region

Convert = Callable[[NDArray[Any]], NDArray[Any]]


class View(Protocol):
    shape: Shape

    def read(self, region: Region) -> NDArray[Any]: ...

    def locate(self, index: tuple[int, ...]) -> tuple[int, tuple[int, ...]]: ...


class SourceView:
    """A stored tensor (a Zarr array or anything with numpy indexing), converted to values numpy computes with."""

    def __init__(self, array: Any, convert: Convert, shard: int = 0) -> None:
        self.array = array
        self.shape: Shape = tuple(int(d) for d in array.shape)
        self._convert = convert
        self._shard = shard

    def read(self, region: Region) -> NDArray[Any]:
        raw = np.asarray(self.array[region] if region else self.array[()])
        return self._convert(raw.reshape(tuple(s.stop - s.start for s in region)))

    def locate(self, index: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
        return self._shard, index


class ConcatView:
    def __init__(self, parts: Sequence[View], axis: int) -> None:
        self.parts = list(parts)
        self.axis = axis
        first = self.parts[0].shape
        self.shape: Shape = first[:axis] + (sum(p.shape[axis] for p in self.parts),) + first[axis + 1 :]
        self._starts = np.cumsum([0] + [p.shape[axis] for p in self.parts]).tolist()

    def read(self, region: Region) -> NDArray[Any]:
        want = region[self.axis]
        pieces = []
        for part, lo, hi in zip(self.parts, self._starts, self._starts[1:], strict=False):
            start, stop = max(want.start, lo), min(want.stop, hi)
            if start < stop:
                sub = region[: self.axis] + (slice(start - lo, stop - lo),) + region[self.axis + 1 :]
                pieces.append(part.read(sub))
        return np.concatenate(pieces, axis=self.axis)

    def locate(self, index: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
        i = index[self.axis]
        for part, lo, hi in zip(self.parts, self._starts, self._starts[1:], strict=False):
            if lo <= i < hi:
                return part.locate(index[: self.axis] + (i - lo,) + index[self.axis + 1 :])
        raise IndexError(index)


class SqueezeView:
    """The inner view without its size-1 dimensions."""

    def __init__(self, inner: View) -> None:
        self.inner = inner
        self._kept = [i for i, d in enumerate(inner.shape) if d != 1]
        self.shape: Shape = tuple(inner.shape[i] for i in self._kept)

    def _expand(self, parts: Sequence[Any], unit: Any) -> tuple[Any, ...]:
        full = [unit] * len(self.inner.shape)
        for position, i in enumerate(self._kept):
            full[i] = parts[position]
        return tuple(full)

    def read(self, region: Region) -> NDArray[Any]:
        values = self.inner.read(self._expand(region, slice(0, 1)))
        return values.reshape(tuple(s.stop - s.start for s in region))

    def locate(self, index: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
        return self.inner.locate(self._expand(index, 0))


class PermuteView:
    """Dimension i of this view is dimension perm[i] of the inner one."""

    def __init__(self, inner: View, perm: tuple[int, ...]) -> None:
        self.inner = inner
        self.perm = perm
        self.shape: Shape = tuple(inner.shape[p] for p in perm)

    def read(self, region: Region) -> NDArray[Any]:
        inner_region: list[slice] = [slice(0, 0)] * len(self.perm)
        for i, p in enumerate(self.perm):
            inner_region[p] = region[i]
        return np.ascontiguousarray(self.inner.read(tuple(inner_region)).transpose(self.perm))

    def locate(self, index: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
        inner = [0] * len(self.perm)
        for i, p in enumerate(self.perm):
            inner[p] = index[i]
        return self.inner.locate(tuple(inner))


class TruncateView:
    def __init__(self, inner: View, axis: int, size: int) -> None:
        self.inner = inner
        self.axis = axis
        self.shape: Shape = inner.shape[:axis] + (size,) + inner.shape[axis + 1 :]

    def read(self, region: Region) -> NDArray[Any]:
        return self.inner.read(region)

    def locate(self, index: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
        return self.inner.locate(index)


class StackView:
    """Replicas: dimension 0 is the rank, each rank's view (all of one shape) the rest."""

    def __init__(self, parts: Sequence[View]) -> None:
        self.parts = list(parts)
        self.shape: Shape = (len(self.parts), *self.parts[0].shape)

    def read(self, region: Region) -> NDArray[Any]:
        ranks, inner = region[0], region[1:]
        if ranks.start >= ranks.stop:
            return self.parts[0].read(inner)[np.newaxis][:0]
        return np.stack([self.parts[k].read(inner) for k in range(ranks.start, ranks.stop)])

    def locate(self, index: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
        return self.parts[index[0]].locate(index[1:])


class RepeatView:
    """The inner view once per rank along a new dimension 0 (compared with each of the other side's replicas)."""

    def __init__(self, inner: View, times: int) -> None:
        self.inner = inner
        self.shape: Shape = (times, *inner.shape)

    def read(self, region: Region) -> NDArray[Any]:
        values = self.inner.read(region[1:])
        return np.repeat(values[np.newaxis], region[0].stop - region[0].start, axis=0)

    def locate(self, index: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
        return self.inner.locate(index[1:])


class FlattenView:
    def __init__(self, inner: View) -> None:
        self.inner = inner
        self.shape: Shape = (math.prod(inner.shape),)

    def read(self, region: Region) -> NDArray[Any]:
        (flat,) = region
        boxes = flat_boxes(self.inner.shape, flat.start, flat.stop)
        if not boxes:
            return self.inner.read(tuple(slice(0, 0) for _ in self.inner.shape)).reshape(0)
        return np.concatenate([self.inner.read(box).reshape(-1) for box in boxes])

    def locate(self, index: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
        inner = np.unravel_index(index[0], self.inner.shape) if self.inner.shape else ()
        return self.inner.locate(tuple(int(i) for i in inner))


def flat_boxes(shape: Shape, start: int, stop: int) -> list[Region]:
    """Boxes covering the C-order flat range [start, stop) of `shape`, in order."""
    if start >= stop:
        return []
    if not shape:
        return [()]
    if len(shape) == 1:
        return [(slice(start, stop),)]
    inner = math.prod(shape[1:])
    full = tuple(slice(0, d) for d in shape[1:])
    first, first_off = divmod(start, inner)
    last, last_off = divmod(stop, inner)
    if first == last:
        return [(slice(first, first + 1), *box) for box in flat_boxes(shape[1:], first_off, last_off)]
    boxes: list[Region] = []
    if first_off:
        boxes += [(slice(first, first + 1), *box) for box in flat_boxes(shape[1:], first_off, inner)]
        first += 1
    if last > first:
        boxes.append((slice(first, last), *full))
    if last_off:
        boxes += [(slice(last, last + 1), *box) for box in flat_boxes(shape[1:], 0, last_off)]
    return boxes


def build_view(shards: Sequence[View], steps: Sequence[Step]) -> View:
    """Apply one side's alignment steps to its stored shards (already wrapped as views). Replicas (a stack step):
    each shard gets the other steps, then they are stacked."""
    if any(s.kind == "stack" for s in steps):
        return StackView([build_view([shard], [s for s in steps if s.kind != "stack"]) for shard in shards])
    view: View = shards[0]
    if len(shards) > 1:
        concat = next((s for s in steps if s.kind == "concat"), None)
        if concat is None:
            raise ValueError("several shards need a concat step")
        view = ConcatView(shards, concat.axis)
    for step in steps:
        if step.kind == "squeeze":
            view = SqueezeView(view)
        elif step.kind == "permute":
            view = PermuteView(view, step.perm)
        elif step.kind == "truncate":
            view = TruncateView(view, step.axis, step.size)
        elif step.kind == "flatten":
            view = FlattenView(view)
        elif step.kind == "repeat":
            view = RepeatView(view, step.size)
    return view


def flat_source(view: View) -> SourceView | None:
    """The stored tensor whose values, in C order from the first, are this view's values in C order (as many as the
    view has), or None where the view reorders values or joins several tensors. Dropping or adding size-1
    dimensions, flattening, and truncating the outermost non-trivial dimension keep that order; permuting,
    concatenating, stacking replicas and repeating do not."""
    while not isinstance(view, SourceView):
        order_kept = isinstance(view, SqueezeView | FlattenView) or (
            isinstance(view, TruncateView) and all(d == 1 for d in view.shape[: view.axis])
        )
        if not order_kept:
            return None
        view = view.inner  # type: ignore[attr-defined]
    return view
