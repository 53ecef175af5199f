"""Where inside a failing pair its error is, as results keep it (engine/where.py computes it). Light on purpose (no
numpy): the reports the command line reads from a running server hold it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ErrorSpan:
    """The index ranges (inclusive) of aligned dimension `dim` (of `size`) that hold SHARE of a pair's error."""

    dim: int
    size: int
    ranges: tuple[tuple[int, int], ...]

    def to_json(self) -> dict[str, Any]:
        return {"dim": self.dim, "size": self.size, "ranges": [[s, e] for s, e in self.ranges]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ErrorSpan:
        return cls(int(data["dim"]), int(data["size"]), tuple((int(s), int(e)) for s, e in data["ranges"]))
