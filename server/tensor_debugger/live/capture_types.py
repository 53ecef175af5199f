"""What a capture is asked for (its level and values) and what it gives (`CaptureResult`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from tensor_debugger.engine.summary_compare import Sketch

Level = Literal["module", "op"]
LEVELS: tuple[Level, ...] = ("module", "op")
Values = Literal["full", "summary"]
VALUES: tuple[Values, ...] = ("full", "summary")


@dataclass
class CaptureResult:
    """Filled in when the block ends: where the run went and how many tensors it holds."""

    session: str
    run: str
    tensors: int = 0
    session_id: int | None = None
    run_id: int | None = None
    skipped: list[str] = field(default_factory=list)  # values left out and why ("...: a str, not a tensor")
    # with values="summary": each tensor's summary, by its name in the run, in call order
    summaries: dict[str, Sketch] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)  # a captured op's tensors' callers, by name
    # with values="summary": a module call's inputs' and outputs' names, each with the line of the user's code that
    # called the module ("<file>:<line>", the innermost frame outside torch, as an op's source): where a module's
    # input is the first divergence, that line passed it
    called_at: dict[str, str] = field(default_factory=dict)
    # a module call's inputs' names, each with the parameter of the module's `forward` its argument binds to (where
    # the signature could be read: `live/parameters.py`), as the run stores it: what pairs `attn(x=h)` with `attn(h)`
    parameters: dict[str, str] = field(default_factory=dict)
    rank: int | None = None  # inside torch.distributed: this process's rank (tensors, skipped: all ranks')


def check_level_and_values(level: str, values: str) -> None:
    """A ValueError naming the choices where a capture's `level` or `values` is none of them."""
    if level not in LEVELS:
        raise ValueError(f"capture level must be one of {', '.join(LEVELS)}, got {level!r}")
    if values not in VALUES:
        raise ValueError(f"capture values must be one of {', '.join(VALUES)}, got {values!r}")
