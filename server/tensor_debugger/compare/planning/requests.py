"""A compare asked for, as the command line and a server it hands the work to exchange them (JSON
over the local API: `web/controllers/local.py`). Light on purpose: the command line that finds a server running
imports this and not the database or the array store. Its outcome: compare/reports/compare_report.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from tensor_debugger.errors import InvalidInputError

EXIT_PASS, EXIT_FAIL, EXIT_UNUSABLE = 0, 1, 2
# (step, done, total): "ingest <label>" in bytes; "early" the pairs compared while the candidate ingests and how
# many of them are outside tolerance; "compare" the pairs computed after the plan, of those it had to compute
StepProgress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class CompareRequest:
    a: Path  # the reference run's input, absolute (a server's working folder is not the command's)
    b: Path
    a_shown: str  # each as the user typed it: labels, names and problems say it so
    b_shown: str
    name: str | None = None
    rtol: float | None = None
    atol: float | None = None
    pairing: dict[str, Any] = field(default_factory=dict)  # a pairing file's JSON, checked by `compare_runs`
    pairing_shown: str | None = None  # the pairing file's path, for messages
    fail_fast: bool = False
    ulp: int | None = None  # set: pairs pass within this many ULPs of their lower-precision dtype
    more: tuple[Path, ...] = ()  # further candidate runs after `b`, absolute, each compared with the reference
    more_shown: tuple[str, ...] = ()
    noise: Path | None = None  # a rerun of the reference, absolute: the noise floor (`compare/reports/noise.py`)
    noise_shown: str | None = None
    noise_factor: float | None = None  # None: NOISE_FACTOR
    # globs of reference tensor names that may have no partner in a candidate (`--allow-unmatched`)
    allow_unmatched: tuple[str, ...] = ()

    @property
    def candidates(self) -> list[tuple[Path, str]]:
        """Every candidate run's input and how the user typed it: `b`, then `more`."""
        return [(self.b, self.b_shown), *zip(self.more, self.more_shown, strict=True)]

    def to_json(self) -> dict[str, Any]:
        return {
            **self.__dict__,
            "a": str(self.a),
            "b": str(self.b),
            "more": [str(p) for p in self.more],
            "more_shown": list(self.more_shown),
            "noise": None if self.noise is None else str(self.noise),
            "allow_unmatched": list(self.allow_unmatched),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CompareRequest:
        """Raises InvalidInputError on a request that is not one."""
        try:
            request = cls(
                **{
                    **data,
                    "a": Path(data["a"]),
                    "b": Path(data["b"]),
                    "more": tuple(Path(p) for p in data.get("more", ())),
                    "more_shown": tuple(str(p) for p in data.get("more_shown", ())),
                    "noise": None if data.get("noise") is None else Path(data["noise"]),
                    "allow_unmatched": tuple(str(g) for g in data.get("allow_unmatched", ())),
                }
            )
        except (KeyError, TypeError) as exc:
            raise InvalidInputError(f"not a compare request: {exc}") from None
        if len(request.more) != len(request.more_shown):
            raise InvalidInputError("not a compare request: every further candidate needs the path as typed")
        noise = () if request.noise is None else (request.noise,)
        if not all(p.is_absolute() for p in (request.a, request.b, *request.more, *noise)):
            raise InvalidInputError("a compare request names its inputs by absolute paths")
        return request


class IngestRequest(msgspec.Struct, frozen=True):
    """`tensor-debugger ingest` handed to a server: the run's inputs by absolute path, each with how it was typed."""

    session: str
    run: str
    paths: list[str]
    shown: list[str]
    against: str | None = None  # the label of the session's run it is compared against (None: the reference)


class ServerIdentity(msgspec.Struct, frozen=True):
    """Who answers on the local API: the command line checks that the server is its data dir's."""

    pid: int
    database_url: str
    store_url: str


def wanted_name(request: CompareRequest) -> str:
    """The session name a compare asks for: `--name`, else "A vs B"; `free_name` makes it "A vs B (2)" where taken."""
    names = [Path(typed).name for typed in [request.a_shown, *(typed for _, typed in request.candidates)]]
    return request.name or f"{names[0]} vs {', '.join(names[1:])}"
