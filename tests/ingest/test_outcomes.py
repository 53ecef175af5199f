"""outcomes.outcome_of: how an ingest that stopped ends its run, for each thing that can stop it."""

from __future__ import annotations

import errno

from tensor_debugger.errors import (
    DiskFullError,
    FileProblem,
    IngestPostponed,
    NothingUsableError,
    StoreWriteError,
)
from tensor_debugger.ingest.outcomes import IngestCancelled, RunEnd, RunOutcome, TakenOver, outcome_of


def why(outcome: RunOutcome) -> list[tuple[str, str]]:
    """The outcome's problems as (file, reason): FileProblem is an exception, compared by identity."""
    return [(p.file, p.reason) for p in outcome.problems]


def test_nothing_usable_keeps_every_problem_or_drops_the_run() -> None:
    exc = NothingUsableError([FileProblem("a.pt", "not a tensor file"), FileProblem("b.pt", "holds no tensors")])
    kept = outcome_of(exc, None, True, False, "a.pt, b.pt", "cand")
    assert (kept.end, kept.error, kept.problems, kept.fresh) == (RunEnd.FAILED, exc, tuple(exc.problems), False)
    assert outcome_of(exc, None, False, False, "a.pt, b.pt", "cand").end is RunEnd.DROPPED


def test_an_outage_leaves_the_run_waiting_and_says_what_did_not_answer() -> None:
    outcome = outcome_of(OSError("connection refused"), "the database did not answer", True, True, "a.pt", "cand")
    assert outcome.end is RunEnd.WAITING and outcome.fresh
    assert isinstance(outcome.error, IngestPostponed) and outcome.error.reason == "the database did not answer"


def test_a_stopping_server_leaves_a_staged_run_waiting_and_drops_any_other() -> None:
    exc = IngestCancelled("the server is stopping")
    staged = outcome_of(exc, None, True, True, "a.pt", "cand")
    assert (staged.end, staged.error, staged.fresh) == (RunEnd.WAITING, exc, False)
    assert outcome_of(exc, None, True, False, "a.pt", "cand").end is RunEnd.DROPPED


def test_a_full_disk_or_a_failed_store_write_fails_the_run_whoever_asked() -> None:
    full = outcome_of(OSError(errno.ENOSPC, "No space left on device"), None, False, False, "a.pt", "cand")
    assert full.end is RunEnd.FAILED and full.best_effort and full.fresh
    assert isinstance(full.error, DiskFullError) and "the run 'cand'" in str(full.error)
    assert why(full) == [("a.pt", str(full.error))]
    write = StoreWriteError("the arrays of b.pt", "access denied", "b.pt")
    failed = outcome_of(write, None, False, False, "a.pt, b.pt", "cand")
    assert (failed.end, failed.error, why(failed)) == (RunEnd.FAILED, write, [("b.pt", str(write))])


def test_any_other_error_fails_the_run_with_it_as_the_problem_or_drops_it() -> None:
    exc = ValueError("bad header")
    kept = outcome_of(exc, None, True, False, "a.pt", "cand")
    assert (kept.end, why(kept), kept.fresh) == (RunEnd.FAILED, [("a.pt", "the ingest failed: bad header")], False)
    assert outcome_of(exc, None, False, False, "a.pt", "cand").end is RunEnd.DROPPED
    assert outcome_of(KeyboardInterrupt(), None, True, True, "a.pt", "cand").end is RunEnd.DROPPED


def test_a_run_taken_over_is_left_to_the_other_process() -> None:
    exc = TakenOver("run 3 is no longer this process's to ingest")
    assert outcome_of(exc, "the database did not answer", True, True, "a.pt", "cand").end is RunEnd.THEIRS
