"""How an ingest that stopped ends its run, decided in one place: `outcome_of` turns what stopped it into a
`RunOutcome` (failed with why, dropped, left waiting for a later try, or left to the process that took it over),
and `Ingestor` applies it (ingest/runs.py). A run that ingests to the end is stored: its outcome is its result.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from tensor_debugger.errors import (
    DiskFullError,
    FileProblem,
    IngestPostponed,
    NothingUsableError,
    StoreWriteError,
    is_disk_full,
)


class IngestCancelled(Exception):  # noqa: N818 (a signal, not an error: the server is stopping)
    """Raised from a progress callback to stop an ingest; the run is removed as if it never began."""


class TakenOver(Exception):  # noqa: N818 (a signal: the work is another process's now)
    """The run's claim is another process's (this one's lapsed during an outage, and a replica took the ingest
    over): this ingest stops without touching the run, its arrays or its staged files."""


class RunEnd(Enum):
    FAILED = "failed"  # kept with status "failed", its problems saying why, no arrays
    DROPPED = "dropped"  # removed, arrays and all (and its session, when its ingest made it and nothing else is in it)
    WAITING = "waiting"  # stays "ingesting" among this process's live runs, its arrays deleted, for a later try
    THEIRS = "theirs"  # another process's now: nothing of it is touched


@dataclass(frozen=True)
class RunOutcome:
    """What becomes of a run whose ingest stopped, and what its caller is told."""

    end: RunEnd
    error: BaseException  # raised to the caller once the outcome is applied
    problems: tuple[FileProblem, ...] = ()  # FAILED: why, kept as the run's problems
    best_effort: bool = False  # FAILED: where even the row cannot be written (a full disk), the run is left as is
    fresh: bool = False  # `error` is raised anew (`raise error from None`), not re-raised with its own traceback


def outcome_of(
    exc: BaseException, outage: str | None, keep_failure: bool, staged: bool, what: str, run_label: str
) -> RunOutcome:
    """The outcome of an ingest that raised `exc`. `outage`: what did not answer, when `exc` says the database or
    the array store did not (Ingestor.outage); `keep_failure`: a run with nothing usable (or that failed) stays
    "failed"; `staged`: the run names its staged files (an accepted upload's, which another start takes over);
    `what`: the inputs' labels, for a problem of the whole run.

    - TakenOver: the run is theirs.
    - NothingUsableError: failed with every file's problem, or (not `keep_failure`) dropped.
    - an outage, or IngestCancelled of a staged run: waiting (IngestPostponed raised for the outage).
    - a full disk or a store that failed a write: failed whoever asked, the session saying why (DiskFullError for
      any error that a full disk caused).
    - IngestCancelled: dropped; any other error: failed with it as the problem, or dropped.
    - anything not an Exception (KeyboardInterrupt): dropped."""
    if isinstance(exc, TakenOver):
        return RunOutcome(RunEnd.THEIRS, exc)
    if isinstance(exc, NothingUsableError):
        return RunOutcome(RunEnd.FAILED if keep_failure else RunEnd.DROPPED, exc, tuple(exc.problems))
    if not isinstance(exc, Exception):
        return RunOutcome(RunEnd.DROPPED, exc)
    if outage is not None:
        return RunOutcome(RunEnd.WAITING, IngestPostponed(outage), fresh=True)
    if staged and isinstance(exc, IngestCancelled):
        return RunOutcome(RunEnd.WAITING, exc)
    if is_disk_full(exc) and not isinstance(exc, DiskFullError):
        exc = DiskFullError(f"the run {run_label!r}")
    if isinstance(exc, DiskFullError | StoreWriteError):
        file = exc.file if isinstance(exc, StoreWriteError) and exc.file else what
        return RunOutcome(RunEnd.FAILED, exc, (FileProblem(file, str(exc)),), best_effort=True, fresh=True)
    if isinstance(exc, IngestCancelled) or not keep_failure:
        return RunOutcome(RunEnd.DROPPED, exc)
    return RunOutcome(RunEnd.FAILED, exc, (FileProblem(what, f"the ingest failed: {exc}"),))
