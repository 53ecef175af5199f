from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, ForeignKey, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from tensor_debugger.store.models.base import Base

PAIR_STATUSES = ("pending", "pass", "fail", "incomparable", "error")


class PairRecord(Base):
    """A reference tensor (or its shards) matched with a candidate tensor, in execution order.

    `alignment` is the chain of views making them comparable (null: incomparable); `result_id` points at the
    cached statistics for the two tensors' digests, that alignment and the session's tolerances.
    """

    __tablename__ = "pairs"
    # A pair's id is in its page's address: SQLite must never give a deleted pair's id to another pair (without
    # AUTOINCREMENT it reuses the highest ids); a pair planned again keeps its id (compare/planning/plan.py).
    __table_args__ = {"sqlite_autoincrement": True}

    id: Mapped[int] = mapped_column(primary_key=True)
    session_id: Mapped[int] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"), index=True)
    run_a_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    run_b_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    position: Mapped[int]  # execution order within the session
    name: Mapped[str] = mapped_column(Text)
    layer: Mapped[int | None]
    stage: Mapped[str | None] = mapped_column(String(200))
    strategy: Mapped[str] = mapped_column(String(20))
    a_name: Mapped[str] = mapped_column(Text)
    b_name: Mapped[str] = mapped_column(Text)
    a_tensor_ids: Mapped[list[Any]] = mapped_column(JSON)  # shards in rank order
    b_tensor_ids: Mapped[list[Any]] = mapped_column(JSON)
    alignment: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    alignment_overridden: Mapped[bool] = mapped_column(default=False)
    status: Mapped[str] = mapped_column(String(20), default="pending", index=True)
    result_id: Mapped[int | None] = mapped_column(ForeignKey("comparison_results.id", ondelete="SET NULL"))
    error: Mapped[str | None] = mapped_column(Text)
    module_path: Mapped[str | None] = mapped_column(Text)  # the reference tensor's, from a module trace
    place: Mapped[str | None] = mapped_column(String(200))
    # when a side has no element values (a use_repr=True trace): the verdict on shape and summary statistics
    summary: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # the process computing it while "pending", and until when (Unix seconds): store/claims.py
    claimed_by: Mapped[str | None] = mapped_column(String(100))
    claimed_until: Mapped[float | None]
