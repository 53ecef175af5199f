from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, ForeignKey, Text
from sqlalchemy.orm import Mapped, mapped_column

from tensor_debugger.store.models.base import Base


class UnmatchedRecord(Base):
    """A tensor of `run_id` that found no partner in `other_run_id`: listed, never silently dropped."""

    __tablename__ = "unmatched"

    id: Mapped[int] = mapped_column(primary_key=True)
    session_id: Mapped[int] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"), index=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    other_run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    position: Mapped[int]
    name: Mapped[str] = mapped_column(Text)
    tensor_ids: Mapped[list[Any]] = mapped_column(JSON)
