"""A compare's session left by a compare that was killed before its candidates were ingested, taken over by the
next run of the same command instead of a new session "name (2)" being made beside it.

While a compare lives, its session holds its candidates' runs "ingesting" under its process (`pipeline.py` begins
every run's row before the first is ingested), so a session of the wanted name whose only run is a ready reference,
once the runs of dead ingests are dropped (`recovery.remove_dead_ingests`), is one whose compare died with its
reference stored. It is taken over only when nothing in it is a user's: it has no notes, no hand pairs, no pair
order, strategies, name pattern or dimension names, its one run made the session, and that run was ingested from
the very inputs (the same fingerprint, `ingest/fingerprints.py`) under the label this compare gives its reference.
Anything else, and the new session is "name (2)" as before.

The session looked for is of the wanted name, or of a name given in its place because that one was taken
("name (2)", `catalog.first_free_name`): a compare killed in "x (2)" is taken over by the same command as one
killed in "x", where "x" is another compare's, complete. Of several such sessions, the first by name.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session as DbSession
from sqlalchemy.orm import sessionmaker

from tensor_debugger.ingest.fingerprints import fingerprint_inputs
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.ingest.recovery import remove_dead_ingests
from tensor_debugger.ingest.runs import Ingestor, archive_limits
from tensor_debugger.store.models import PairOverrideRecord, RunRecord, SessionRecord


@dataclass(frozen=True)
class Interrupted:
    session_id: int
    reference_run_id: int  # ready: kept, not ingested again
    name: str  # the session's: the wanted name, or one given in its place ("name (2)")


def interrupted_session(ingestor: Ingestor, name: str, reference_label: str, given: InputFile) -> Interrupted | None:
    """The session named `name` (or in its place, "name (2)"...) left by a killed compare of the same reference
    inputs `given` (see the module's docstring), its dead ingests' runs dropped; None where there is none to take
    over."""
    sessions: sessionmaker[DbSession] = ingestor.sessions
    with sessions() as db:
        if not _named(db, name):
            return None  # the usual case: nothing fingerprinted
    reference = fingerprint_inputs([given], archive_limits(ingestor.settings), ingestor.settings.threads)
    if reference is None:  # inputs that cannot be fingerprinted: never known to be the same
        return None
    # the killed compare's half-ingested runs, as any command's start-up recovery drops them (a server's compare
    # may come before its next sweep); uploads whose files are staged are left for the server
    remove_dead_ingests(sessions, ingestor.store, ingestor.live_runs, ingestor.claims, ingestor.resumable)
    with sessions() as db:
        for session in _named(db, name):
            run_id = _killed_reference(db, session, reference_label, reference.key)
            if run_id is not None:
                return Interrupted(session.id, run_id, session.name)
    return None


def _named(db: DbSession, name: str) -> list[SessionRecord]:
    """The sessions named `name`, or "name (n)" in its place (n from 2: `catalog.first_free_name`), by name."""
    like = db.scalars(select(SessionRecord).where(SessionRecord.name.startswith(name, autoescape=True)))
    found = [(_number(s.name, name), s) for s in like]
    return [s for n, s in sorted(((n, s) for n, s in found if n is not None), key=lambda f: f[0])]


def _number(given: str, name: str) -> int | None:
    """1 for `name` itself, n for "name (n)" (n from 2), None for any other name."""
    if given == name:
        return 1
    rest = given[len(name) :]
    if rest.startswith(" (") and rest.endswith(")") and rest[2:-1].isdigit() and not rest[2:-1].startswith("0"):
        n = int(rest[2:-1])
        return n if n >= 2 else None
    return None


def _killed_reference(db: DbSession, session: SessionRecord, reference_label: str, key: str) -> int | None:
    """The id of `session`'s one run, where it is a killed compare's ready reference ingested from the inputs of
    fingerprint `key` under `reference_label`, and nothing in the session is a user's; None otherwise."""
    if session.notes or _arranged(session):
        return None
    runs = list(db.scalars(select(RunRecord).where(RunRecord.session_id == session.id)))
    if len(runs) != 1:  # a candidate still ingesting (its compare lives), stored, or failed; more runs
        return None
    (run,) = runs
    hand_pairs = db.scalar(select(PairOverrideRecord.id).where(PairOverrideRecord.session_id == session.id))
    same = (
        run.status == "ready"
        and run.position == 0
        and run.role == "reference"
        and run.created_session
        and run.label == reference_label
        and run.input_key == key
    )
    return run.id if hand_pairs is None and same else None


def _arranged(session: SessionRecord) -> bool:
    """Whether a user arranged the session (what a compare never sets)."""
    return any(v is not None for v in (session.pair_order, session.strategies, session.name_pattern, session.dims))
