"""A store belongs to one database: the database holds a random id (one row, `database_identity`) and the array
store's root holds a marker naming it (`tensor-debugger-store.json`), both written once, by the first start of the
pair. Every process checks them before it recovers, deletes or writes anything (`services.open_services`).

A process given the cluster's store with another database (a fresh SQLite, say) would otherwise take the cluster's
arrays for its own: write its runs over theirs, or delete them. One given the cluster's database with another store
would make sessions whose arrays no replica can read. So `pair` refuses (StorePairingError) where:

- both have ids and they differ;
- the store has a marker and the database has no id (a new database against a store in use);
- the database has an id and the store has no marker but holds arrays (not this database's), or holds none while
  the database names arrays (another, empty store);
- neither has an id (a new pair, or a data dir from before the marker existed) but the store holds arrays and the
  database names none, or the database names arrays and the store does not hold the newest of them.

Otherwise a missing id is written: the database's first (a row insert that one of several processes starting at
once wins; the others read the winner's), then the store's marker. A command that only reads (`writes=False`)
checks and writes nothing.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session as DbSession
from sqlalchemy.orm import sessionmaker

from tensor_debugger.errors import StorePairingError, StoreUnavailableError, StoreWriteError
from tensor_debugger.store.arrays import ArrayStore
from tensor_debugger.store.models import IDENTITY_SLOT, DatabaseIdentityRecord, TensorRecord

MARKER = "tensor-debugger-store.json"
FIX = (
    "point TENSOR_DEBUGGER_DATABASE_URL and TENSOR_DEBUGGER_STORE_URL at a database and the store it was used with "
    "(both, on every replica), or give a new database a new, empty store"
)


@dataclass(frozen=True)
class Pairing:
    """What a start found: the database's id, and whether this start wrote it or the store's marker."""

    database_id: str | None  # None: a command that only reads found a new pair and wrote nothing
    wrote_database_id: bool
    wrote_marker: bool


def hidden_password(database_url: str) -> str:
    """The database URL as a message may show it: its password, if any, as ***."""
    try:
        return make_url(database_url).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy parses: nothing of it is shown but its scheme
        return database_url.split(":", 1)[0] + ":…"


def database_id(db: DbSession) -> str | None:
    return db.scalar(select(DatabaseIdentityRecord.database_id).where(DatabaseIdentityRecord.slot == IDENTITY_SLOT))


def marker_id(store: ArrayStore) -> str | None:
    """The database id in the store's marker; None where the store has no marker. A marker that cannot be read is
    refused: it is not this project's, or was damaged."""
    data = store.read_object(MARKER)
    if data is None:
        return None
    try:
        document: Any = json.loads(data)
        found = document["database_id"]
        if not isinstance(found, str) or not found:
            raise ValueError(found)
    except (ValueError, KeyError, TypeError):
        raise StorePairingError(
            f"the array store {store.url} holds a {MARKER} without a database id in it: not one this program wrote"
        ) from None
    return found


def stores_arrays(store: ArrayStore) -> bool:
    return any(name.isdigit() for name in store.children("runs"))


def newest_array(db: DbSession) -> str | None:
    """The store key of the newest tensor row that names an array; None where the database names none."""
    return db.scalar(
        select(TensorRecord.store_key).where(TensorRecord.store_key != "").order_by(TensorRecord.id.desc()).limit(1)
    )


def holds(store: ArrayStore, key: str) -> bool:
    parent, _, name = key.rpartition("/")
    return name in store.children(parent)


def pair(sessions: sessionmaker[DbSession], store: ArrayStore, database_url: str, writes: bool = True) -> Pairing:
    """Check that the database and the store are one pair, writing the id or the marker that a new pair lacks
    (not where `writes` is False); StorePairingError where they are not (see the module's docstring)."""

    def refuse(found: str) -> StorePairingError:
        return StorePairingError(
            f"the database {hidden_password(database_url)} and the array store {store.url} are not one pair: "
            f"{found}. Nothing was written to the store or deleted from it; {FIX}"
        )

    with sessions() as db:
        ours = database_id(db)
    theirs = marker_id(store)
    if ours is None and theirs is not None:
        with sessions() as db:  # written meanwhile by another process starting on the same new pair?
            ours = database_id(db)
        if ours is None:
            raise refuse(
                f"the store belongs to database {theirs} and this database has no id (a new database, or another one)"
            )
    if ours is not None and theirs is not None:
        if ours != theirs:
            raise refuse(f"the store belongs to database {theirs}, and this database is {ours}")
        return Pairing(ours, False, False)
    # the store has no marker
    with sessions() as db:
        named = newest_array(db)
    arrays = stores_arrays(store)
    if ours is not None:
        if arrays:
            raise refuse(f"this database is {ours}, and the store has no marker but holds arrays: not this database's")
        if named is not None:
            raise refuse(f"this database is {ours} and names arrays (such as {named}) that the store, empty, lacks")
    elif arrays and named is None:
        raise refuse("the store holds arrays and this new database names none: they are another database's")
    elif named is not None and not holds(store, named):
        raise refuse(f"the database names arrays (such as {named}) that the store does not hold")
    if not writes:
        return Pairing(ours, False, False)
    wrote_id = False
    if ours is None:
        ours, wrote_id = _write_database_id(sessions)
    _write_marker(store, ours, refuse)
    return Pairing(ours, wrote_id, True)


def _write_database_id(sessions: sessionmaker[DbSession]) -> tuple[str, bool]:
    """The database's id, new and written unless another process wrote one first (then that one)."""
    new = uuid.uuid4().hex
    try:
        with sessions.begin() as db:
            db.add(DatabaseIdentityRecord(slot=IDENTITY_SLOT, database_id=new))
    except IntegrityError:
        with sessions() as db:
            found = database_id(db)
        if found is None:
            raise
        return found, False
    return new, True


def _write_marker(store: ArrayStore, ours: str, refuse: Callable[[str], StorePairingError]) -> None:
    """The store's marker for database `ours`, unless another process starting on the same pair wrote it first."""
    theirs = marker_id(store)
    if theirs is not None:
        if theirs != ours:
            raise refuse(f"the store belongs to database {theirs}, and this database is {ours}")
        return
    document = {"database_id": ours, "created_at": datetime.now(UTC).isoformat(timespec="seconds")}
    try:
        store.write_object(MARKER, (json.dumps(document, indent=2) + "\n").encode())
    except (StoreWriteError, OSError) as exc:
        raise StoreUnavailableError(
            f"cannot write the marker {MARKER} that ties the array store {store.url} to its database: {exc}"
        ) from None
