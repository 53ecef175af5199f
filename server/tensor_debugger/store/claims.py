"""Claims on work several processes may take (pending pairs, runs being ingested), as leases in the rows.

A claim is `claimed_by` (the claiming process's `owner` token: host, process id and a random part) and
`claimed_until` (Unix seconds). A process renews its claims every third of the lease (`Claims.start` runs the
heartbeat); the claims of one that died expire and another process takes the work over. Pairs are claimed a batch
per statement, `UPDATE … WHERE id IN (SELECT … FOR UPDATE SKIP LOCKED) RETURNING id` on PostgreSQL, so replicas
claiming at once skip each other's rows instead of waiting on them; on SQLite the same UPDATE runs under the
database's single writer lock (FOR UPDATE means nothing there, and none is rendered). A claim of a single row
(recovery's) is a compare-and-swap on the claim it read.

Clocks: leases compare each process's own clock (time.time) with the others'; hosts a few seconds apart in
time are covered by leases of tens of seconds.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import ColumnElement, and_, or_, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session as DbSession
from sqlalchemy.orm import sessionmaker

from tensor_debugger.store.models import PairRecord, RunRecord

log = logging.getLogger(__name__)
DEFAULT_LEASE_SECONDS = 30.0  # Settings.claim_seconds's default
# `claimed_by` of a pending pair whose computation waits for the array store or the database to answer again: held
# by nobody until `claimed_until`, then any process tries it again
OUTAGE_HOLDER = "waiting for an outage to end"
OUTAGE_MAX_SECONDS = 60.0  # the longest wait between tries while an outage goes on (1, 2, 4 ... seconds before),
# where no Settings.outage_retry_seconds is given


def new_owner() -> str:
    """A token naming one process's claims: readable (host and pid) and never reused (the random part)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def claimable(model: type[PairRecord] | type[RunRecord], now: float) -> ColumnElement[bool]:
    """Rows nobody holds: never claimed, released, or whose lease has expired."""
    return or_(model.claimed_until.is_(None), model.claimed_until < now)


class Claims:
    """One process's claims in one database: taking them, renewing them while the work goes on, giving them back."""

    def __init__(
        self,
        sessions: sessionmaker[DbSession],
        lease_seconds: float,
        owner: str | None = None,
        outage_max_seconds: float = OUTAGE_MAX_SECONDS,
    ) -> None:
        """`outage_max_seconds`: the longest hold of pairs that met an outage (`Settings.outage_retry_seconds`)."""
        if lease_seconds <= 0:
            raise ValueError(f"a lease must last a positive number of seconds, got {lease_seconds}")
        self.sessions = sessions
        self.lease_seconds = lease_seconds
        self.owner = owner or new_owner()
        self.outage_max_seconds = outage_max_seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._outages = 0  # batches in a row that met an outage: each doubles the next hold
        self.outages_met = 0  # batches that met an outage, ever (a computation stops setting up when it grows)

    def until(self) -> float:
        return time.time() + self.lease_seconds

    def outage_hold(self) -> dict[str, Any]:  # column -> value, for an UPDATE's values()
        """The claim columns of a pending pair whose computation met an outage (the store or the database did not
        answer): held by nobody for the backoff, 1 s after the first batch that met one, then twice as long after
        each further one in a row, up to `outage_max_seconds`."""
        delay = min(self.outage_max_seconds, 2.0 ** min(self._outages, 16))
        return {"claimed_by": OUTAGE_HOLDER, "claimed_until": time.time() + delay}

    def outage_met(self) -> None:
        """A batch of work met an outage: the next hold is twice as long."""
        self._outages += 1
        self.outages_met += 1

    def outage_over(self) -> None:
        """A computation succeeded: the next outage's hold is 1 s again."""
        self._outages = 0

    def hold_pairs(self, pair_ids: Sequence[int]) -> None:
        """Hold this process's claims on `pair_ids` still pending for the outage backoff, untried: an outage met by
        the pairs before them would meet them too."""
        if not pair_ids:
            return
        with self.sessions.begin() as db:
            db.execute(
                update(PairRecord)
                .where(PairRecord.id.in_(pair_ids), PairRecord.claimed_by == self.owner, PairRecord.status == "pending")
                .values(**self.outage_hold())
                .execution_options(synchronize_session=False)
            )

    # --- pending pairs ------------------------------------------------------------------------------------

    def claim_pairs(self, session_id: int | None, limit: int, pair_ids: Sequence[int] | None = None) -> list[int]:
        """Claim up to `limit` pending pairs nobody holds (of one session, or any; among `pair_ids` if given), the
        first in execution order first; returns their ids in that order."""
        now = time.time()
        wanted = select(PairRecord.id).where(PairRecord.status == "pending", claimable(PairRecord, now))
        if session_id is not None:
            wanted = wanted.where(PairRecord.session_id == session_id)
        if pair_ids is not None:
            wanted = wanted.where(PairRecord.id.in_(pair_ids))
        wanted = wanted.order_by(PairRecord.session_id, PairRecord.position).limit(limit)
        statement = (
            update(PairRecord)
            .where(PairRecord.id.in_(wanted.with_for_update(skip_locked=True)))
            .values(claimed_by=self.owner, claimed_until=self.until())
            .returning(PairRecord.id, PairRecord.session_id, PairRecord.position)
            .execution_options(synchronize_session=False)
        )
        with self.sessions.begin() as db:
            rows = db.execute(statement).all()
        return [row.id for row in sorted(rows, key=lambda r: (r.session_id, r.position))]

    def release_pairs(self) -> None:
        """Give back this process's claims on pairs still pending (a computation stopped or failed midway)."""
        with self.sessions.begin() as db:
            db.execute(
                update(PairRecord)
                .where(PairRecord.claimed_by == self.owner, PairRecord.status == "pending")
                .values(claimed_by=None, claimed_until=None)
                .execution_options(synchronize_session=False)
            )

    # --- runs -------------------------------------------------------------------------------------------

    def run_claim(self) -> dict[str, Any]:  # column -> value, for an UPDATE's values()
        """The columns of a run this process begins to ingest: claimed by it until the lease runs out."""
        return {"claimed_by": self.owner, "claimed_until": self.until()}

    def take_run(self, db: DbSession, run_id: int, seen_owner: str | None, seen_until: float | None) -> bool:
        """Claim a run still "ingesting" from the claim it had when read (recovery's), as the first statement of
        `db`'s transaction (so that on SQLite it holds the writer lock from there on). False: another process
        changed or took it meanwhile."""
        done = db.execute(
            update(RunRecord)
            .where(
                and_(
                    RunRecord.id == run_id,
                    RunRecord.status == "ingesting",
                    RunRecord.claimed_by.is_not_distinct_from(seen_owner),
                    RunRecord.claimed_until.is_not_distinct_from(seen_until),
                )
            )
            .values(claimed_by=self.owner, claimed_until=self.until())
            .execution_options(synchronize_session=False)
        )
        return bool(done.rowcount)  # type: ignore[attr-defined]

    # --- the heartbeat ------------------------------------------------------------------------------------

    def renew(self) -> None:
        """Extend every lease this process holds on work not finished yet."""
        until = self.until()
        with self.sessions.begin() as db:
            for model, status in ((PairRecord, "pending"), (RunRecord, "ingesting")):
                db.execute(
                    update(model)
                    .where(model.claimed_by == self.owner, model.status == status)
                    .values(claimed_until=until)
                    .execution_options(synchronize_session=False)
                )

    def start(self, also: Callable[[], None] | None = None) -> None:
        """Renew this process's leases in a background thread, every third of the lease, then call `also`
        (periodic housekeeping, such as removing runs whose ingest died) on the same beat."""
        self._thread = threading.Thread(target=self._beat, args=(also,), name="claims-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _beat(self, also: Callable[[], None] | None) -> None:
        while not self._stop.wait(self.lease_seconds / 3):
            try:
                self.renew()
            except SQLAlchemyError:  # the database is briefly away: the next beat tries again
                log.exception("renewing this process's claims failed")
            if also is not None:
                try:
                    also()
                except Exception:  # the next beat tries again
                    log.exception("housekeeping on the claims' beat failed")
