from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from tensor_debugger.store.models.base import Base, utcnow


class ComparisonResultRecord(Base):
    """The persistent comparison cache: statistics keyed by both sides' content digests, the alignment and the
    tolerances, so an identical comparison, in any session, is never computed twice."""

    __tablename__ = "comparison_results"

    id: Mapped[int] = mapped_column(primary_key=True)
    cache_key: Mapped[str] = mapped_column(String(80), unique=True)
    digests_a: Mapped[list[Any]] = mapped_column(JSON)
    digests_b: Mapped[list[Any]] = mapped_column(JSON)
    alignment_key: Mapped[str] = mapped_column(Text)
    rtol: Mapped[float]
    atol: Mapped[float]
    stats: Mapped[dict[str, Any]] = mapped_column(JSON)
    # error profiles computed on request (compare/profiles.py), by aligned dimension ("0", "1", ...); null: none yet
    profiles: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
