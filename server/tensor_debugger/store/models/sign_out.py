from __future__ import annotations

from sqlalchemy import Double, String
from sqlalchemy.orm import Mapped, mapped_column

from tensor_debugger.store.models.base import Base


class SignOutRecord(Base):
    """A browser's signed-in session that signed out before its cookie expired (web/auth.py): every process on
    this database refuses the cookie until it would have expired anyway, then the row may go."""

    __tablename__ = "sign_outs"

    nonce: Mapped[str] = mapped_column(String(64), primary_key=True)  # the cookie's random part
    expires_at: Mapped[float] = mapped_column(Double, index=True)  # Unix seconds, the cookie's own expiry
