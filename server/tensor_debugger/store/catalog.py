"""Reading and changing what is stored: sessions, runs and tensors (metadata and arrays together)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import ColumnElement, Text, and_, cast, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session as DbSession
from sqlalchemy.orm import aliased, selectinload

from tensor_debugger.errors import ConflictError, InvalidInputError, NotFoundError
from tensor_debugger.store.arrays import ArrayStore, run_prefix
from tensor_debugger.store.database import lock_arrays
from tensor_debugger.store.models import PairRecord, RunRecord, SessionRecord, TensorRecord, UnmatchedRecord

MAX_LABEL = 200  # characters of a session name or run label
MAX_NOTES = 64 * 1024  # characters of a session's notes (every session list carries them)
MAX_ULP = 2**20  # the most units in the last place a session's ulp tolerance may be


def parse_label(text: str, what: str) -> str:
    """A session name or run label: at most 200 characters, not only spaces, no control characters; stripped of
    the spaces around it."""
    value = text.strip()
    if not value or len(text) > MAX_LABEL or any(ord(c) < 32 for c in text):
        raise InvalidInputError(f"{what} must be 1 to {MAX_LABEL} printable characters, got {text[:MAX_LABEL]!r}")
    return value


def parse_notes(text: str) -> str:
    if len(text) > MAX_NOTES:
        raise InvalidInputError(f"notes may take at most {MAX_NOTES} characters, got {len(text)}")
    return text


def list_sessions(db: DbSession, search: str | None = None) -> Sequence[SessionRecord]:
    """Every session, newest first; `search` keeps those whose name contains it (any case)."""
    query = (
        select(SessionRecord)
        .options(selectinload(SessionRecord.runs))
        .order_by(SessionRecord.created_at.desc(), SessionRecord.id.desc())
    )
    if search:
        query = query.where(func.lower(SessionRecord.name).contains(search.lower(), autoescape=True))
    return db.scalars(query).all()


@dataclass(frozen=True)
class SessionSummary:
    pairs: int
    failing: int
    pending: int
    first_divergence: str | None  # the name of the earliest failing pair
    not_compared: int = 0  # incomparable, or their comparison failed
    unmatched: int = 0  # reference tensors with no partner in a candidate, that the user did not allow
    first_pair: int | None = None  # the earliest failing pair's id
    # passing pairs judged on summaries whose content hashes differ: their values differ, though the summaries found
    # nothing outside tolerance (no verified pass)
    values_differ: int = 0


def summarize_sessions(db: DbSession, session_ids: Sequence[int]) -> dict[int, SessionSummary]:
    """Pair counts, first divergences, unmatched reference tensors and passes on summaries whose hashes differ, of
    many sessions in five queries, for the sessions list."""
    if not session_ids:
        return {}
    # a rerun of the reference (role "noise") is the noise floor of the candidate's pairs, not pairs of its own:
    # its pairs are not counted (a session of 35 tensors with a rerun has 35 pairs, not 70), but wait for them
    candidate = aliased(RunRecord)
    noise = func.coalesce(candidate.role, "") == "noise"
    counts = db.execute(
        select(PairRecord.session_id, PairRecord.status, noise, func.count())
        .join(candidate, candidate.id == PairRecord.run_b_id)
        .where(PairRecord.session_id.in_(session_ids))
        .group_by(PairRecord.session_id, PairRecord.status, noise)
    ).all()
    first_positions = (
        select(PairRecord.session_id, func.min(PairRecord.position).label("position"))
        .join(candidate, candidate.id == PairRecord.run_b_id)
        .where(PairRecord.session_id.in_(session_ids), PairRecord.status == "fail", ~noise)
        .group_by(PairRecord.session_id)
        .subquery()
    )
    firsts = db.execute(
        select(PairRecord.session_id, PairRecord.name, PairRecord.id)
        .join(
            first_positions,
            (PairRecord.session_id == first_positions.c.session_id)
            & (PairRecord.position == first_positions.c.position),
        )
        .join(candidate, candidate.id == PairRecord.run_b_id)
        .where(~noise)
    ).all()
    reference, other = aliased(RunRecord), aliased(RunRecord)
    unmatched = dict(
        db.execute(
            select(UnmatchedRecord.session_id, func.count(func.distinct(UnmatchedRecord.name)))
            .join(reference, reference.id == UnmatchedRecord.run_id)
            .join(other, other.id == UnmatchedRecord.other_run_id)
            .where(
                UnmatchedRecord.session_id.in_(session_ids),
                # the tensors of the run each candidate is compared against: the reference, or the run it names
                or_(
                    other.compared_against_id == reference.id,
                    and_(other.compared_against_id.is_(None), reference.position == 0),
                ),
                other.role != "noise",
                UnmatchedRecord.allowed.is_(False),
            )
            .group_by(UnmatchedRecord.session_id)
        ).all()
    )
    full = aliased(PairRecord)
    differ = dict(
        db.execute(
            select(PairRecord.session_id, func.count())
            .join(candidate, candidate.id == PairRecord.run_b_id)
            .where(
                PairRecord.session_id.in_(session_ids),
                PairRecord.status == "pass",
                ~noise,
                cast(PairRecord.summary, Text).contains('"hashes_differ": true'),  # as the JSON column writes it
                # not where a second capture with full values compared that tensor element by element
                ~select(full.id)
                .where(
                    full.session_id == PairRecord.session_id,
                    full.name == PairRecord.name,
                    full.id != PairRecord.id,
                    or_(full.summary.is_(None), cast(full.summary, Text) == "null"),  # SQL NULL or JSON null
                    full.status.in_(("pass", "fail")),
                )
                .exists(),
            )
            .group_by(PairRecord.session_id)
        ).all()
    )
    total: dict[int, dict[str, int]] = {}
    pending: dict[int, int] = {}  # the rerun's pairs too: the candidate's verdicts wait for their noise floor
    for session_id, status, of_noise, n in counts:
        if status == "pending":
            pending[session_id] = pending.get(session_id, 0) + n
        if not of_noise:
            total.setdefault(session_id, {})[status] = n
    first = {session_id: (name, pair_id) for session_id, name, pair_id in firsts}
    return {
        sid: SessionSummary(
            sum(total.get(sid, {}).values()),
            total.get(sid, {}).get("fail", 0),
            pending.get(sid, 0),
            first[sid][0] if sid in first else None,
            total.get(sid, {}).get("incomparable", 0) + total.get(sid, {}).get("error", 0),
            unmatched.get(sid, 0),
            first[sid][1] if sid in first else None,
            differ.get(sid, 0),
        )
        for sid in session_ids
    }


def lock_sessions(db: DbSession, session_ids: Iterable[int]) -> set[int]:
    """Hold, until `db`'s transaction ends, the right to change the pairs of these sessions; returns the ids of those
    that exist. Taken before reading what a change of pairs depends on: a plan deletes a session's pairs and makes
    them again, and SQLite gives the new pairs the ids of those deleted, so a verdict read for one pair before a
    plan and written by id after it would land on another pair. A write to each session's row, in id order (two
    lockers never wait for each other), holds SQLite's writer lock from here (pysqlite begins a transaction at the
    first write, not the first read) and, on another database, the sessions' rows."""
    locked: set[int] = set()
    for session_id in sorted(set(session_ids)):
        done = db.execute(update(SessionRecord).where(SessionRecord.id == session_id).values(id=SessionRecord.id))
        if done.rowcount:  # type: ignore[attr-defined]
            locked.add(session_id)
    return locked


def lock_sessions_of_pairs(db: DbSession, pair_ids: Iterable[int]) -> None:
    """`lock_sessions` for the sessions of these pairs (before reading the pairs to give them verdicts)."""
    ids = sorted(set(pair_ids))
    sessions: set[int] = set()
    for start in range(0, len(ids), 500):
        sessions.update(db.scalars(select(PairRecord.session_id).where(PairRecord.id.in_(ids[start : start + 500]))))
    lock_sessions(db, sessions)


def get_session(db: DbSession, session_id: int) -> SessionRecord:
    session = db.scalar(
        select(SessionRecord)
        .where(SessionRecord.id == session_id)
        .options(selectinload(SessionRecord.runs).selectinload(RunRecord.problems))
    )
    if session is None:
        raise NotFoundError(f"no session with id {session_id}")
    return session


def free_name(db: DbSession, wanted: str) -> str:
    """`wanted`, or where a session has that name, `wanted (2)` (the first number free): what a new session is
    named, from the command line (`compare`, `explore`) and the API alike."""
    taken = set(db.scalars(select(SessionRecord.name).where(SessionRecord.name.startswith(wanted, autoescape=True))))
    return first_free_name(wanted, taken)


def first_free_name(wanted: str, taken: Collection[str]) -> str:
    """`wanted`, or where it is among `taken`, `wanted (n)` with the first n from 2 that is not: `free_name`'s rule,
    for names listed elsewhere (a server's, by `live/upload.py`)."""
    if wanted not in taken:
        return wanted
    n = 2
    while f"{wanted} ({n})" in taken:
        n += 1
    return f"{wanted} ({n})"


def create_session(db: DbSession, name: str, notes: str = "") -> SessionRecord:
    """A new session named `name`, or `name (2)` where that is taken (`free_name`): the record says which."""
    name = free_name(db, parse_label(name, "session name"))
    session = SessionRecord(name=name, notes=parse_notes(notes))
    db.add(session)
    try:
        db.flush()
    except IntegrityError:  # another request took the name at the same moment
        raise ConflictError(f"a session named {name!r} was created at the same time: try again") from None
    return session


def update_session(db: DbSession, session_id: int, name: str | None, notes: str | None) -> SessionRecord:
    session = get_session(db, session_id)
    if name is not None:
        name = parse_label(name, "session name")
        clash = db.scalar(select(SessionRecord.id).where(SessionRecord.name == name, SessionRecord.id != session_id))
        if clash is not None:
            raise ConflictError(f"a session named {name!r} exists already")
        session.name = name
    if notes is not None:
        session.notes = parse_notes(notes)
    try:
        db.flush()
    except IntegrityError:
        raise ConflictError(f"a session named {name!r} exists already") from None
    return session


def set_tolerances(session: SessionRecord, rtol: float | None, atol: float | None, ulp: int | None = None) -> None:
    """Set the session's tolerances (None: torch.testing's default for each pair's dtypes); `ulp` (1 or more)
    judges float pairs in ULPs of their lower-precision dtype instead."""
    for name, value in (("rtol", rtol), ("atol", atol)):
        if value is not None and not (value >= 0 and value < float("inf")):
            raise InvalidInputError(f"{name} must be a non-negative finite number, got {value}")
    if ulp is not None and (isinstance(ulp, bool) or not isinstance(ulp, int) or not 1 <= ulp <= MAX_ULP):
        raise InvalidInputError(f"ulp must be a whole number of units in the last place, 1 to {MAX_ULP}, got {ulp}")
    session.rtol, session.atol, session.ulp = rtol, atol, ulp


def set_noise_factor(session: SessionRecord, factor: float | None) -> None:
    """Set how many times the noise floor a candidate's error may be (None: the default, NOISE_FACTOR)."""
    if factor is not None and not (factor > 0 and factor < float("inf")):
        raise InvalidInputError(f"the noise factor must be a positive finite number, got {factor}")
    session.noise_factor = factor


def delete_session(db: DbSession, store: ArrayStore, session_id: int) -> None:
    """Delete the session's rows, then the arrays no other run's tensors share (an interruption between leaves
    orphans that recovery removes, never rows without arrays)."""
    lock_arrays(db)
    session = get_session(db, session_id)
    run_ids = [run.id for run in session.runs]
    keys = set(
        db.scalars(select(TensorRecord.store_key).where(TensorRecord.run_id.in_(run_ids), TensorRecord.store_key != ""))
    )
    db.delete(session)
    db.commit()
    release_arrays(db, store, run_ids, keys)


def refuse_while_ingesting(db: DbSession, session_id: int) -> None:
    """A user's deletion of a session one of whose runs is still being ingested is refused (ConflictError naming
    them): the ingest would go on writing that run's rows and arrays, and SQLite gives a deleted run's id (and its
    folder in the store) to the next run made, so they would land in another session's run."""
    labels = list(
        db.scalars(
            select(RunRecord.label)
            .where(RunRecord.session_id == session_id, RunRecord.status == "ingesting")
            .order_by(RunRecord.position)
        )
    )
    if labels:
        named = ("run " if len(labels) == 1 else "runs ") + ", ".join(repr(label) for label in labels)
        raise ConflictError(
            f"session {session_id} is still ingesting {named}: delete it once the ingest has ended (the session "
            f"page shows its progress); nothing was deleted"
        )


def keys_under(prefix: str) -> ColumnElement[bool]:
    """Tensor rows whose array lies under `prefix` ("runs/12"), as a range the index on store_key serves ("/"
    sorts just before "0")."""
    return (TensorRecord.store_key > f"{prefix}/") & (TensorRecord.store_key < f"{prefix}0")


def release_arrays(db: DbSession, store: ArrayStore, run_ids: Iterable[int], keys: Iterable[str]) -> None:
    """After the rows of runs `run_ids` (naming the arrays `keys`) are deleted and committed: delete each of
    `keys` that no tensor row names any more, and the folder of each run gone whose arrays no row names.

    An array belongs to every tensor row that names it, in any run of any session; a row names an array under its
    own run's folder or an older run's, whose folder outlives the run while a row names something in it."""
    keys = set(keys)
    still: set[str] = set()
    listed = sorted(keys)
    for start in range(0, len(listed), 500):
        still.update(
            db.scalars(select(TensorRecord.store_key).where(TensorRecord.store_key.in_(listed[start : start + 500])))
        )
    folders = set(run_ids) | {
        int(k.split("/")[1]) for k in keys if k.startswith("runs/") and k.count("/") >= 2 and k.split("/")[1].isdigit()
    }
    emptied: set[str] = set()
    for run_id in folders:
        prefix = run_prefix(run_id)
        if (
            db.get(RunRecord, run_id) is None
            and db.scalar(select(TensorRecord.id).where(keys_under(prefix)).limit(1)) is None
        ):
            store.delete(prefix)
            emptied.add(f"{prefix}/")
    for key in sorted(keys - still):
        if not any(key.startswith(folder) for folder in emptied):
            store.delete(key)


def get_run(db: DbSession, run_id: int) -> RunRecord:
    run = db.scalar(select(RunRecord).where(RunRecord.id == run_id).options(selectinload(RunRecord.problems)))
    if run is None:
        raise NotFoundError(f"no run with id {run_id}")
    return run


def relabel_run(db: DbSession, run_id: int, label: str) -> RunRecord:
    """Rename a run; refused when another run of its session has that label."""
    run = get_run(db, run_id)
    value = parse_label(label, "run label")
    clash = db.scalar(
        select(RunRecord.id).where(
            RunRecord.session_id == run.session_id, RunRecord.label == value, RunRecord.id != run_id
        )
    )
    if clash is not None:
        raise InvalidInputError(f"another run of this session is labelled {value!r}")
    run.label = value
    return run


def list_tensors(db: DbSession, run_id: int) -> Sequence[TensorRecord]:
    get_run(db, run_id)
    return db.scalars(select(TensorRecord).where(TensorRecord.run_id == run_id).order_by(TensorRecord.position)).all()


def get_tensor(db: DbSession, tensor_id: int) -> TensorRecord:
    tensor = db.get(TensorRecord, tensor_id)
    if tensor is None:
        raise NotFoundError(f"no tensor with id {tensor_id}")
    return tensor
