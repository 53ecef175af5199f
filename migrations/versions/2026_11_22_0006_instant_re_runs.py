"""instant re-runs: a run's input fingerprint, arrays shared by tensors of several runs

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-22 12:40:00.000000

Rows written before this revision have no fingerprint (their runs are never reused) and each names an array of
its own run, which the index on `store_key` and the deletion by reference treat like any shared array.
Downgrading leaves shared arrays shared, and the previous version deletes an array with the run that wrote it:
delete the sessions made since first. (As with every downgrade here that drops a column, SQLite copies the table:
run it with foreign keys off, or dropping the old `runs` cascades to its tensors.)
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('input_fingerprint', sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column('input_key', sa.String(length=80), nullable=True))
        batch_op.create_index(batch_op.f('ix_runs_input_key'), ['input_key'], unique=False)
    with op.batch_alter_table('tensors', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_tensors_store_key'), ['store_key'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('tensors', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_tensors_store_key'))
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_runs_input_key'))
        batch_op.drop_column('input_key')
        batch_op.drop_column('input_fingerprint')
