from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, ForeignKey, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from tensor_debugger.store.models.base import Base

OVERRIDE_ACTIONS = ("pair", "unpair", "align")


class PairOverrideRecord(Base):
    """A user's word on pairing, kept across re-pairing: pair these two, never pair these two, or align them so."""

    __tablename__ = "pair_overrides"

    id: Mapped[int] = mapped_column(primary_key=True)
    session_id: Mapped[int] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"), index=True)
    run_b_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    action: Mapped[str] = mapped_column(String(10))
    a_name: Mapped[str] = mapped_column(Text)
    b_name: Mapped[str] = mapped_column(Text)
    steps: Mapped[list[Any] | None] = mapped_column(JSON)  # for "align": the alignment steps
