from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import JSON, BigInteger, ForeignKey, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from tensor_debugger.store.models.base import Base, utcnow

if TYPE_CHECKING:
    from tensor_debugger.store.models.problem import ProblemRecord
    from tensor_debugger.store.models.session import SessionRecord
    from tensor_debugger.store.models.tensor import TensorRecord

RUN_STATUSES = ("ingesting", "ready", "failed")


class RunRecord(Base):
    """One side's dump. `position` 0 is the reference run; a session may hold more than two runs.

    A run is visible only once `status` is "ready": an ingest writes its arrays first and flips the status in
    the same transaction that inserts its tensors, so a killed ingest leaves nothing half-visible. A "failed"
    run (an upload ingested in the background that held nothing usable) has no tensors and no arrays, only its
    problems, so the session page can say why.

    `input_key` (a digest of `input_fingerprint`: each input file's path, size, modification time and content
    digest, and the run's labels) says what the run was ingested from: an ingest of the same unchanged files
    reuses a ready run's tensors (their rows point at the same arrays) instead of reading the files again.
    """

    __tablename__ = "runs"
    # ids never reused (in /runs/<id>, the API and the array store's folder "runs/<id>"): see SessionRecord
    __table_args__ = (
        UniqueConstraint("session_id", "label", name="uq_runs_session_label"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    session_id: Mapped[int] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"), index=True)
    label: Mapped[str] = mapped_column(String(200))
    role: Mapped[str] = mapped_column(String(20))  # "reference" or "candidate"
    position: Mapped[int]
    # the id of the run of the same session this one is compared against (its pairs' side "a"); None: the session's
    # reference (compare/planning/plan.py's `compared_with`). Set on ingest (`--against`) or by
    # SessionActions.compare_against. No foreign key (migration 0020 says why): a run's deletion clears it in the
    # runs compared against it (store/compared_against.py's `forget`)
    compared_against_id: Mapped[int | None]
    status: Mapped[str] = mapped_column(String(20), default="ingesting")
    ingest_pid: Mapped[int | None]  # the process writing it while "ingesting"
    ingest_host: Mapped[str | None] = mapped_column(String(255))
    # the process ingesting it while "ingesting", and until when its lease holds (Unix seconds): store/claims.py
    claimed_by: Mapped[str | None] = mapped_column(String(100))
    claimed_until: Mapped[float | None]
    created_session: Mapped[bool] = mapped_column(default=False)  # its ingest made the session; undo removes it
    sources: Mapped[list[Any]] = mapped_column(JSON, default=list)  # file names as the user gave them
    # an accepted upload's files while "ingesting": [[path under the staging folder, label], ...], so that another
    # process (a replica, the next start) takes the ingest over from them when this one dies (ingest/recovery.py)
    staged_inputs: Mapped[list[Any] | None] = mapped_column(JSON)
    tensor_count: Mapped[int] = mapped_column(default=0)
    total_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # The next two are loaded only when read (deferred): a run of 2,000 files has a 400 kB fingerprint, which
    # every page listing a session's runs decoded (70 ms of the session page) and none of them shows.
    # a module trace's or a capture's call tree: {"source": "hf-trace"|"capture", "values": bool, "roots": [...]}
    module_tree: Mapped[dict[str, Any] | None] = mapped_column(JSON, deferred=True)
    # ingest/fingerprints.py; None: unknown
    input_fingerprint: Mapped[dict[str, Any] | None] = mapped_column(JSON, deferred=True)
    input_key: Mapped[str | None] = mapped_column(String(80), index=True)

    session: Mapped[SessionRecord] = relationship(back_populates="runs")
    tensors: Mapped[list[TensorRecord]] = relationship(
        back_populates="run", order_by="TensorRecord.position", cascade="all, delete-orphan"
    )
    problems: Mapped[list[ProblemRecord]] = relationship(
        back_populates="run", order_by="ProblemRecord.id", cascade="all, delete-orphan"
    )
