from __future__ import annotations

from datetime import datetime

from sqlalchemy import Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from tensor_debugger.store.models.base import Base, utcnow

IDENTITY_SLOT = 1  # the one row's key: a second process inserting its own id clashes with the first's


class DatabaseIdentityRecord(Base):
    """The database's id, one row written once (store/identity.py): the array store it uses holds the same id in its
    marker, so a process given a database and a store that belong to different pairs refuses to start."""

    __tablename__ = "database_identity"

    slot: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    database_id: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
