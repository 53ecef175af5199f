"""judged figures of the sessions list: session_figures.not_compared

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-29 09:30:00.000000

The sessions list's figures judged as the session's page judges them (a session with a rerun, or with a pair
stored as a pass before a pair whose alignment cut reference rows away was no pass) now hold the count of pairs
not compared (incomparable or errored) as well: the rows' own count says a pass where the page says incomparable.
The figures kept before lack it: they are a cache of what the report computes, so they are deleted, and the next
list judges those sessions again.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("DELETE FROM session_figures")
    with op.batch_alter_table("session_figures") as batch:
        batch.add_column(sa.Column("not_compared", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("session_figures") as batch:
        batch.drop_column("not_compared")
