from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import JSON, String, Text
from sqlalchemy.orm import Mapped, mapped_column, relationship

from tensor_debugger.store.models.base import Base, utcnow

if TYPE_CHECKING:
    from tensor_debugger.store.models.run import RunRecord


class SessionRecord(Base):
    """A named comparison a user keeps: two or more runs of the same model."""

    __tablename__ = "sessions"
    # A session's id is in its page's address and the API: SQLite must never give a deleted session's id to another
    # (without AUTOINCREMENT it reuses the highest ids); PostgreSQL's sequences never go back.
    __table_args__ = {"sqlite_autoincrement": True}

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    notes: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    rtol: Mapped[float | None]  # the session's tolerances; null: torch.testing's defaults for each pair's dtypes
    atol: Mapped[float | None]
    ulp: Mapped[int | None]  # above 0: pairs pass within this many ULPs of their lower-precision dtype, not rtol/atol
    noise_factor: Mapped[float | None]  # with a noise run: a pair passes when its error is within this times the noise
    # the user's order of pairs ("reference name|candidate name"), set by dragging rows; null: execution order
    pair_order: Mapped[list[Any] | None] = mapped_column(JSON)
    # the pairing strategies in the order tried ("layer_stage", "name", "fuzzy:0.8", ...); null: the default chain
    strategies: Mapped[list[Any] | None] = mapped_column(JSON)
    name_pattern: Mapped[str | None] = mapped_column(Text)  # a regex with groups layer, stage (rank); null: none
    # globs of reference tensor names allowed to have no partner (`compare --allow-unmatched`); null: none
    allow_unmatched: Mapped[list[Any] | None] = mapped_column(JSON)
    # names of the tensors' aligned dimensions, by name glob: {"*attn*": "batch,heads,tokens,head_dim"}; null: none
    dims: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    runs: Mapped[list[RunRecord]] = relationship(
        back_populates="session", order_by="RunRecord.position", cascade="all, delete-orphan"
    )
