"""judged figures of the sessions list: session_figures

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-28 19:30:00.000000

A session with a rerun (role "noise") is judged on its page by the noise rule, while its pairs' rows carry the
tolerances' verdicts: the sessions list judged each such session again on every load (one report of all its pairs).
This table keeps each such session's failing count and first divergence with the fingerprint of what they were
judged from (store/session_figures.py); a new table, so nothing existing is copied.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "session_figures",
        sa.Column("session_id", sa.Integer(), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("failing", sa.Integer(), nullable=False),
        sa.Column("first_divergence", sa.Text(), nullable=True),
        sa.Column("first_pair", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["session_id"], ["sessions.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("session_id"),
    )


def downgrade() -> None:
    op.drop_table("session_figures")
