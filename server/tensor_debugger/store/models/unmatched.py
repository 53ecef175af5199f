from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Boolean, ForeignKey, Text, false
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
    # the user allowed it to stay unpaired (a pairing file's `unpaired`, an unpair by hand, the session's
    # allow_unmatched globs): it does not make the session's verdict incomplete
    allowed: Mapped[bool] = mapped_column(Boolean, server_default=false(), default=False)
    # a reference tensor's place in execution order: the position of the first pair after it (one past its
    # candidate's last pair when none is); null for a candidate's tensor
    before_position: Mapped[int | None]
