"""claims on work: the process computing a pending pair or ingesting a run, and until when its lease holds

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23 14:30:00.000000

Several processes (server replicas, a CLI beside a server) share one database: each claims the pending pairs it
computes and the runs it ingests, renewing its leases while it works (store/claims.py). Rows written before this
revision have no claim: nobody holds them.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    for table in ('pairs', 'runs'):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column('claimed_by', sa.String(length=100), nullable=True))
            batch_op.add_column(sa.Column('claimed_until', sa.Double(), nullable=True))


def downgrade() -> None:
    for table in ('runs', 'pairs'):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column('claimed_until')
            batch_op.drop_column('claimed_by')
