"""staged uploads: runs.staged_inputs

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-27 12:10:00.000000

An accepted upload's run names its files in the staging folder while it is ingested, so that when its ingest dies
(its process killed, its replica gone) another process takes it over from those files instead of deleting it.
Runs already stored name none.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('runs') as batch:
        batch.add_column(sa.Column('staged_inputs', sa.JSON(), nullable=True))


def downgrade() -> None:
    # not a batch: on SQLite that recreates `runs`, and dropping the old table deletes its tensors (ON DELETE
    # CASCADE); SQLite 3.35 and later drop a column in place, as other databases do
    op.drop_column('runs', 'staged_inputs')
