from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import Boolean, ForeignKey, Text, false
from sqlalchemy.orm import Mapped, mapped_column, relationship

from tensor_debugger.store.models.base import Base

if TYPE_CHECKING:
    from tensor_debugger.store.models.run import RunRecord


class ProblemRecord(Base):
    """A file (or a value inside one) that an ingest could not use, and why, in words."""

    __tablename__ = "problems"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    file: Mapped[str] = mapped_column(Text)
    reason: Mapped[str] = mapped_column(Text)
    # held no tensor (errors.NotATensor): named, nothing missing from the run
    ignored: Mapped[bool] = mapped_column(Boolean, server_default=false())
    # a note about the run (errors.CaptureNote: what a capture could not see), not a file: also `ignored`
    note: Mapped[bool] = mapped_column(Boolean, server_default=false())

    run: Mapped[RunRecord] = relationship(back_populates="problems")
