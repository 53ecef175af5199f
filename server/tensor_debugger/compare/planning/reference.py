"""Which run of a session is its reference: the one rule that planning, the early comparisons and the reports share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar


class _Run(Protocol):
    @property
    def status(self) -> str: ...

    @property
    def role(self) -> str: ...


R = TypeVar("R", bound=_Run)


def session_reference(runs: Sequence[R]) -> R | None:
    """The session's reference among its `runs` (in order): the first run that did not fail and is not a rerun of
    the reference (role "noise"), else the first that did not fail. A failed run is never the reference: the next
    run takes its place. None where every run failed (or there is none). It may still be ingesting: while it is,
    no other run stands in for it (the plan waits)."""
    kept = [r for r in runs if r.status != "failed"]
    return next((r for r in kept if r.role != "noise"), kept[0] if kept else None)
