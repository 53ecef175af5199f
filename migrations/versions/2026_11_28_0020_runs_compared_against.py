"""runs compared against: runs.compared_against_id

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-28 02:30:00.000000

A run may name the run of its session that it is compared against (find_divergence's "candidate (full)" against
"reference (full)": full values against full values, not against the reference's summaries); null, as every run
before this revision, means the session's reference. Deleting the named run sets it back to null.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("compared_against_id", sa.Integer(), nullable=True))
        batch.create_foreign_key(
            op.f("fk_runs_compared_against_id_runs"), "runs", ["compared_against_id"], ["id"], ondelete="SET NULL"
        )


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint(op.f("fk_runs_compared_against_id_runs"), type_="foreignkey")
        batch.drop_column("compared_against_id")
