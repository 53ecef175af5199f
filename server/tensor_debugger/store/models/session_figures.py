from __future__ import annotations

from sqlalchemy import ForeignKey, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from tensor_debugger.store.models.base import Base


class SessionFiguresRecord(Base):
    """A session's figures on the sessions list as its page judges them (a session with a rerun: by the noise
    rule, which its pairs' rows do not carry), kept with the fingerprint of everything they were judged from
    (store/session_figures.py): the list shows them while the fingerprint still matches, and judges again where not.
    """

    __tablename__ = "session_figures"

    session_id: Mapped[int] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"), primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(64))
    failing: Mapped[int]
    first_divergence: Mapped[str | None] = mapped_column(Text)  # the earliest failing pair's name
    first_pair: Mapped[int | None]  # its id (pair ids are never reused: no foreign key needed to stay true)
    not_compared: Mapped[int] = mapped_column(server_default="0")  # pairs incomparable or errored, as judged
