"""The sessions list's judged figures, kept (`SessionFiguresRecord`) with a fingerprint of everything they were
judged from, so that the list judges a session with a rerun (or an old row to judge again) only when that session
changed.

What a session's judged figures (failing count, first divergence, first pair, pairs not compared) depend on, and
how the fingerprint covers it:

- its pairs' rows (ids, status, comparison result, summary verdict, runs, position, alignment): summed in SQL as
  one number per row (`_row_number`), so reading them costs the database a scan of the session's pair rows (about
  a microsecond a row on SQLite) and Python nothing per pair;
- the statistics of each pair's comparison result: a result row is written once under its key and never changed
  (compare/compute/pending.py), so its id stands for them;
- its runs (ids, order, role, status, the run each is compared against, how many tensors): a run's tensors are
  written before it turns "ready" (ingest/run_endings.py) and never after, so its status and count stand for them;
- the session's tolerances, noise factor and pairing rules, and the user's hand pairings (their ids);
- the rule itself: `FIGURES_RULE` and the package's version.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import BigInteger, ColumnElement, Text, case, cast, delete, func, select
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session as DbSession
from sqlalchemy.orm import sessionmaker

from tensor_debugger import __version__
from tensor_debugger.store.database import SQLITE_BUSY_MS
from tensor_debugger.store.models import (
    PAIR_STATUSES,
    PairOverrideRecord,
    PairRecord,
    RunRecord,
    SessionFiguresRecord,
    SessionRecord,
)

# Raise when the way a session's figures are judged changes (compare/reports/pair_reports.py `judge_by_noise`,
# `_first_divergence_of`): every figure kept under the old rule is then judged again.
FIGURES_RULE = 4  # 4: the pairs not compared, as judged (a cut pair within the noise is incomparable, not a pass)
# (3: a pair whose alignment cut reference rows away is no pass, by the noise rule either)
# (2: a module output of another shape is judged split by each side's own module paths: reshaped.py)
LOCK_WAIT_MS = 100  # the longest keeping the figures waits for a lock (the list then shows them unkept)
_MODULUS = 2_147_483_629  # a prime under 2**31: a row's number times a weight stays far inside 64 bits


@dataclass(frozen=True)
class JudgedFigures:
    failing: int
    first_divergence: str | None  # the earliest failing pair's name
    first_pair: int | None  # its id
    not_compared: int = 0  # pairs incomparable or errored (their verdict, as judged)


def _length(column: Any) -> ColumnElement[int]:
    return func.length(func.coalesce(cast(column, Text), ""))


def _row_number(widen: bool) -> ColumnElement[int]:
    """One number per pair row, under `_MODULUS`, from the columns its verdict and place depend on. The others follow
    from what the fingerprint holds besides: a pair's names are its id's (a pair planned again keeps its id only
    for the same candidate and names: compare/planning/plan.py), its tensors' ids, module path and place those of
    its runs' tensors under those names (unchanged once a run is ready), its layer, stage and strategy the
    session's pairing rules'. `widen`: each term cast to 64 bits first (PostgreSQL multiplies 32-bit integers in
    32 bits and refuses what overflows; SQLite's integers are 64-bit, and the casts would triple its work)."""
    p = PairRecord
    status = case({s: k + 1 for k, s in enumerate(PAIR_STATUSES)}, value=p.status, else_=0)
    weighted: list[tuple[Any, int]] = [
        (status, 1_299_709),
        (p.id, 1_000_003),
        (p.position, 7_919),
        (func.coalesce(p.result_id, 0), 104_729),
        (p.run_a_id, 31),
        (p.run_b_id, 131),
        (case((p.alignment_overridden, 1), else_=0), 3),
        (_length(p.alignment), 15_485_863),
        (_length(p.summary), 15_485_867),
    ]
    terms = [(cast(column, BigInteger) if widen else column) * weight for column, weight in weighted]
    total: ColumnElement[int] = terms[0]
    for term in terms[1:]:
        total = total + term
    return total % _MODULUS


def fingerprints(db: DbSession, session_ids: Sequence[int]) -> dict[int, str]:
    """Each session's fingerprint (64 hex digits) of everything its judged figures depend on."""
    if not session_ids:
        return {}
    ids = list(session_ids)
    widen = db.get_bind().dialect.name != "sqlite"
    parts: dict[int, list[Any]] = {sid: [FIGURES_RULE, __version__] for sid in ids}
    rows = (
        select(PairRecord.session_id, PairRecord.id, _row_number(widen).label("number"))
        .where(PairRecord.session_id.in_(ids))
        .subquery()
    )
    for sid, *figures in db.execute(
        select(
            rows.c.session_id,
            func.count(),
            func.sum(rows.c.number),
            func.sum(rows.c.number * rows.c.number % _MODULUS),
            func.max(rows.c.id),
        ).group_by(rows.c.session_id)
    ):
        parts[sid].append(("pairs", *(int(f or 0) for f in figures)))
    for sid, *run in db.execute(
        select(
            RunRecord.session_id,
            RunRecord.id,
            RunRecord.position,
            RunRecord.role,
            RunRecord.status,
            RunRecord.compared_against_id,
            RunRecord.tensor_count,
        )
        .where(RunRecord.session_id.in_(ids))
        .order_by(RunRecord.session_id, RunRecord.position, RunRecord.id)
    ):
        parts[sid].append(("run", *run))
    for sid, *rules in db.execute(
        select(
            SessionRecord.id,
            SessionRecord.rtol,
            SessionRecord.atol,
            SessionRecord.ulp,
            SessionRecord.noise_factor,
            cast(SessionRecord.strategies, Text),
            SessionRecord.name_pattern,
            cast(SessionRecord.allow_unmatched, Text),
        ).where(SessionRecord.id.in_(ids))
    ):
        parts[sid].append(("session", *rules))
    for sid, count, last, total in db.execute(
        select(
            PairOverrideRecord.session_id,
            func.count(),
            func.max(PairOverrideRecord.id),
            func.sum(_length(PairOverrideRecord.steps)),
        )
        .where(PairOverrideRecord.session_id.in_(ids))
        .group_by(PairOverrideRecord.session_id)
    ):
        parts[sid].append(("overrides", count, last, int(total or 0)))
    return {sid: hashlib.sha256(repr(found).encode()).hexdigest() for sid, found in parts.items()}


def kept_figures(db: DbSession, prints: Mapping[int, str]) -> dict[int, JudgedFigures]:
    """The figures kept for these sessions whose fingerprint is still `prints`' (the others must be judged)."""
    if not prints:
        return {}
    kept = db.execute(
        select(
            SessionFiguresRecord.session_id,
            SessionFiguresRecord.fingerprint,
            SessionFiguresRecord.failing,
            SessionFiguresRecord.first_divergence,
            SessionFiguresRecord.first_pair,
            SessionFiguresRecord.not_compared,
        ).where(SessionFiguresRecord.session_id.in_(list(prints)))
    ).all()
    return {
        sid: JudgedFigures(failing, first_divergence, first_pair, not_compared)
        for sid, fingerprint, failing, first_divergence, first_pair, not_compared in kept
        if prints.get(sid) == fingerprint
    }


def keep_figures(sessions: sessionmaker[Any], judged: Mapping[int, tuple[str, JudgedFigures]]) -> None:
    """Keep each session's judged figures under their fingerprint, in a transaction of their own that waits at most
    `LOCK_WAIT_MS` for the database's locks: the list is a read, and must not wait on a long write (an ingest, a
    comparison's batch); where it would, or where a session was deleted meanwhile, or another request kept its
    figures first, nothing is kept (the next list judges again what it needs)."""
    if not judged:
        return
    with sessions() as db:
        # the transaction's own connection: on SQLite the short wait is a setting of that connection, set back on
        # it (and on no other the pool holds) before it goes back to the pool, whatever happened
        connection = db.connection()
        sqlite = connection.dialect.name == "sqlite"
        raw = connection.connection.dbapi_connection if sqlite else None
        if raw is not None:
            _busy_timeout(raw, LOCK_WAIT_MS)
        else:
            connection.exec_driver_sql(f"SET LOCAL lock_timeout = {LOCK_WAIT_MS}")  # for this transaction alone
        try:
            db.execute(delete(SessionFiguresRecord).where(SessionFiguresRecord.session_id.in_(list(judged))))
            db.add_all(
                SessionFiguresRecord(
                    session_id=sid,
                    fingerprint=fingerprint,
                    failing=figures.failing,
                    first_divergence=figures.first_divergence,
                    first_pair=figures.first_pair,
                    not_compared=figures.not_compared,
                )
                for sid, (fingerprint, figures) in judged.items()
            )
            db.flush()
            kept = True
        except (IntegrityError, OperationalError):
            kept = False
        finally:
            if raw is not None:
                _busy_timeout(raw, SQLITE_BUSY_MS)
        if kept:
            db.commit()
        else:
            db.rollback()


def _busy_timeout(raw: DBAPIConnection, ms: int) -> None:
    """Set how long SQLite connection `raw` waits for another's lock (a setting of the connection, not of its
    transaction, which it leaves as it is)."""
    cursor = raw.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout={ms}")
    finally:
        cursor.close()
