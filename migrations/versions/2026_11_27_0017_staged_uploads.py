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
    with op.batch_alter_table('runs') as batch:
        batch.drop_column('staged_inputs')
