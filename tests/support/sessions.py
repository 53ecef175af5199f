"""A session as tests read it: planned and computed here, its pairs' report (by id or by name), the reference
tensors left unmatched, a run's tensor rows, names and notes."""

from __future__ import annotations

from sqlalchemy import select
from tensor_debugger.compare.reports.pair_reports import SessionPairs, session_pairs
from tensor_debugger.services import Services, open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store.models import ProblemRecord, RunRecord, SessionRecord, TensorRecord, UnmatchedRecord


def session_id_of(settings: Settings, session: str) -> int:
    """The id of the session named `session` (one must exist)."""
    services = open_services(settings)
    try:
        with services.sessions() as db:
            found: int | None = db.scalar(select(SessionRecord.id).where(SessionRecord.name == session))
    finally:
        services.close()
    assert found is not None, session
    return found


def computed(services: Services, session_id: int, *, modules: bool = False) -> SessionPairs:
    """Plan and compute the session with `services`, then read its pairs' report (`modules`: with its module
    reports too)."""
    services.plan(session_id)
    services.compute(session_id)
    with services.sessions() as db:
        return session_pairs(db, session_id, modules=modules)


def compared(settings: Settings, session: int | str, *, modules: bool = False) -> SessionPairs:
    """The session (its id, or its name) planned and computed here: its pairs' report."""
    session_id = session if isinstance(session, int) else session_id_of(settings, session)
    services = open_services(settings)
    try:
        return computed(services, session_id, modules=modules)
    finally:
        services.close()


def unmatched_names(settings: Settings, session_id: int) -> list[str]:
    """The names of the session's tensors that paired with none, as its plan stored them."""
    services = open_services(settings)
    try:
        with services.sessions() as db:
            return list(db.scalars(select(UnmatchedRecord.name).where(UnmatchedRecord.session_id == session_id)))
    finally:
        services.close()


def compared_with_unmatched(settings: Settings, session_id: int) -> tuple[SessionPairs, list[str]]:
    """`compared` with its module reports, and `unmatched_names`: what the op-capture tests read of a session."""
    return compared(settings, session_id, modules=True), unmatched_names(settings, session_id)


def rows_of(settings: Settings, run_id: int) -> list[TensorRecord]:
    """The run's tensor rows, in its order."""
    services = open_services(settings)
    try:
        with services.sessions() as db:
            query = select(TensorRecord).where(TensorRecord.run_id == run_id).order_by(TensorRecord.position)
            return list(db.scalars(query))
    finally:
        services.close()


def names_and_notes(settings: Settings, session: str, run: str) -> tuple[list[str], list[str]]:
    """The names of the run's tensors, in its order, and the reasons of the problems noted on it."""
    services = open_services(settings)
    try:
        with services.sessions() as db:
            run_id = db.scalars(
                select(RunRecord.id).join(SessionRecord).where(SessionRecord.name == session, RunRecord.label == run)
            ).one()
            names = list(
                db.scalars(
                    select(TensorRecord.name).where(TensorRecord.run_id == run_id).order_by(TensorRecord.position)
                )
            )
            notes = [p.reason for p in db.scalars(select(ProblemRecord).where(ProblemRecord.run_id == run_id))]
    finally:
        services.close()
    return names, notes
