"""Which run a run is compared against (`runs.compared_against_id`), checked before it is set: a run of the same
session, not itself, not the session's reference (`session_reference`: a failed first run hands it to the next)
nor a rerun (role "noise": the noise floor of the run it is compared against, never a run compared against), and
no cycle (a run compared against one that is compared, at any remove, against it)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from sqlalchemy import select, update
from sqlalchemy.orm import Session as DbSession

from tensor_debugger.errors import InvalidInputError
from tensor_debugger.store.models import RunRecord, SessionRecord


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
    no other run stands in for it (the plan waits). The one rule that planning, the early comparisons, the reports
    and `check_against` share."""
    kept = [r for r in runs if r.status != "failed"]
    return next((r for r in kept if r.role != "noise"), kept[0] if kept else None)


def check_against(run: RunRecord, against: RunRecord | None, runs: Sequence[RunRecord]) -> None:
    """Raise InvalidInputError, naming both runs and the reason, where `run` (of the session whose runs are `runs`)
    may not be compared against `against` (None: the session's reference, always allowed)."""
    if against is None:
        return
    if against.session_id != run.session_id:
        raise InvalidInputError(
            f"run {run.label!r} cannot be compared against run {against.id} ({against.label!r}): that run is of "
            "another session"
        )
    if against.id == run.id:
        raise InvalidInputError(f"run {run.label!r} cannot be compared against itself")
    reference = session_reference(sorted(runs, key=lambda r: r.position))
    if reference is not None and reference.id == run.id:
        raise InvalidInputError(
            f"run {run.label!r} is the session's reference, which the other runs are compared against; it is "
            "compared against no other run"
        )
    if against.role == "noise":
        # a rerun measures the noise of the run it is compared against (the reference, or a run of the reference's
        # model stored apart, as find_divergence's "reference (full)"): no run's pairs are judged against it
        raise InvalidInputError(
            f"run {against.label!r} is a rerun (the noise floor of the run it is compared against), which no run is "
            f"compared against: run {run.label!r} cannot be compared against it"
        )
    by_id = {r.id: r for r in runs}
    chain = [run.label, against.label]
    step: RunRecord | None = against
    seen = {against.id}
    while step is not None and step.compared_against_id is not None:
        step = by_id.get(step.compared_against_id)
        if step is None:
            break
        chain.append(step.label)
        if step.id == run.id:
            raise InvalidInputError(
                f"run {run.label!r} cannot be compared against {against.label!r}: that makes a cycle "
                f"({' -> '.join(repr(label) for label in chain)})"
            )
        if step.id in seen:
            break
        seen.add(step.id)


def run_labelled(runs: Sequence[RunRecord], label: str, session: str) -> RunRecord:
    """The run of `runs` labelled `label`; InvalidInputError where the session has none."""
    found = next((r for r in runs if r.label == label), None)
    if found is None:
        raise InvalidInputError(
            f"session {session!r} has no run labelled {label!r} to compare against (its runs: "
            f"{', '.join(repr(r.label) for r in runs) or 'none'})"
        )
    return found


def forget(db: DbSession, run_id: int, instead: int | None = None) -> None:
    """Run `run_id` is being deleted: the runs compared against it are compared against `instead` (a run replacing
    it), else against the session's reference again. (The column has no foreign key: SQLite may give a later run
    the deleted one's id, which they would otherwise take for theirs.)"""
    db.execute(
        update(RunRecord)
        .where(RunRecord.compared_against_id == run_id)
        .values(compared_against_id=instead)
        .execution_options(synchronize_session="fetch")
    )


def compare_against_labels(db: DbSession, session_id: int, links: dict[str, str]) -> None:
    """Set which run each of the session's runs named in `links` (its label -> the label of the run it is compared
    against) is compared against, each checked as `check_against` checks it (with the links set before it, so that
    a cycle among them is found); InvalidInputError naming the run and the reason where one may not be (the caller
    rolls back: none is set)."""
    runs = list(db.scalars(select(RunRecord).where(RunRecord.session_id == session_id)))
    by_label = {r.label: r for r in runs}
    session = db.get(SessionRecord, session_id)
    for label, against in links.items():
        run = by_label.get(label)
        if run is None:
            raise InvalidInputError(f"against: the upload has no run labelled {label!r} to compare")
        target = run_labelled(runs, against, session.name if session is not None else str(session_id))
        if target.id == run.id:
            raise InvalidInputError(f"against: run {label!r} cannot be compared against itself")
        check_against(run, target, runs)
        run.compared_against_id = target.id
    db.flush()
