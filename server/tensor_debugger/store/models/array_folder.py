from __future__ import annotations

from datetime import datetime

from sqlalchemy import Integer
from sqlalchemy.orm import Mapped, mapped_column

from tensor_debugger.store.models.base import Base, utcnow


class ArrayFolderRecord(Base):
    """A run's folder in the array store ("runs/<run_id>"), recorded in the transaction that creates the run, before
    any array is written in it, and kept after the run's row goes for as long as the folder may hold arrays.
    Recovery deletes arrays only in these folders (ingest/recovery.py): never what another database wrote."""

    __tablename__ = "array_folders"

    run_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)  # no foreign key
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
