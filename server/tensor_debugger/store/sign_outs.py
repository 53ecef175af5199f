"""Sign-outs in the database, so that every process on it (replicas, the same server after a restart) refuses
a signed-out cookie. A cookie request asks for one row by its primary key; rows go once their cookie would have
expired anyway (at the next sign-out)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import sessionmaker

from tensor_debugger.store.models import SignOutRecord


class SignOuts:
    def __init__(self, sessions: sessionmaker[Any]) -> None:
        self.sessions = sessions

    def record(self, nonce: str, expires_at: float, now: float) -> None:
        """The cookie of `nonce` (valid until `expires_at`, Unix seconds) signed out at `now`."""
        try:
            with self.sessions.begin() as db:
                db.execute(delete(SignOutRecord).where(SignOutRecord.expires_at <= now))
                if db.get(SignOutRecord, nonce) is None:
                    db.add(SignOutRecord(nonce=nonce, expires_at=expires_at))
        except IntegrityError:
            pass  # another process recorded the same sign-out meanwhile (the browser sent it twice)

    def signed_out(self, nonce: str) -> bool:
        with self.sessions() as db:
            return db.get(SignOutRecord, nonce) is not None
