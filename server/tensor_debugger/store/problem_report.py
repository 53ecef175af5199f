"""A file that could not be used, as every report says it (the API, the CLI's JSON, the pages). Light on purpose:
the command line that hands its work to a server decodes it without the database."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class _Problem(Protocol):
    @property
    def file(self) -> str: ...
    @property
    def reason(self) -> str: ...
    @property
    def ignored(self) -> bool: ...
    @property
    def note(self) -> bool: ...


@dataclass(frozen=True)
class ProblemReport:
    """A file that could not be used, and why; `ignored` where it held no tensor (nothing is missing for it);
    `note` where it is a note about the run (what a capture could not see, `file` its trace), not a file's problem
    (`ignored` too: nothing is missing for it)."""

    file: str
    reason: str
    ignored: bool = False
    note: bool = False

    @classmethod
    def of(cls, problem: _Problem) -> ProblemReport:
        """From an ingest's FileProblem or a stored ProblemRecord."""
        return cls(problem.file, problem.reason, bool(problem.ignored), bool(problem.note))
