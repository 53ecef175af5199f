"""The ticks of the pages' chart axes, each at its place in percent of its axis."""

from __future__ import annotations

import msgspec


class AxisTick(msgspec.Struct, frozen=True):
    """A tick with a label: its place in percent of the axis, and what it says (`1e-3`, `1,000`)."""

    at: float
    label: str


class IndexTick(msgspec.Struct, frozen=True):
    """A tick at an index of a tensor's dimension: its place in percent of the axis, and the index."""

    at: float
    index: int
