"""runs compared against: runs.compared_against_id

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-28 02:30:00.000000

A run may name the run of its session that it is compared against (find_divergence's "candidate (full)" against
"reference (full)": full values against full values, not against the reference's summaries); null, as every run
before this revision, means the session's reference.

A plain column, no foreign key: on SQLite a foreign key could only be added by copying `runs`, and with foreign keys
on (as this app's connections have them) dropping the old table deletes every tensor, pair and problem that points
at it. The app clears the column of the runs compared against a run it deletes (store/compared_against.py).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # not in batch mode: a plain ALTER TABLE ... ADD COLUMN on SQLite too
    op.add_column("runs", sa.Column("compared_against_id", sa.Integer(), nullable=True))


def downgrade() -> None:
    # ALTER TABLE ... DROP COLUMN (SQLite 3.35 and later), never a copy of `runs` (see above)
    op.drop_column("runs", "compared_against_id")
