"""problems that are not tensors: problems.ignored

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26 07:00:00.000000

A run's problems are of two kinds: what held no tensor (a config.json beside the weights, a step counter in a state
dict), named and otherwise ignored, and what could not be read (a truncated file, a missing shard), whose tensors
are missing from the run, so that a comparison of it is incomplete. The rows already stored are sorted by the words
the ingest gave the first kind.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('problems') as batch:
        batch.add_column(sa.Column('ignored', sa.Boolean(), server_default=sa.false(), nullable=False))
    problems = sa.table('problems', sa.column('reason', sa.Text()), sa.column('ignored', sa.Boolean()))
    op.execute(
        problems.update()
        .where(
            sa.or_(
                problems.c.reason.like('not a tensor file or archive (%'),
                problems.c.reason.like('not a .npy member%'),
                problems.c.reason.like('not a tensor (%'),
                problems.c.reason.like("not a model_addition_debugger_context trace: no root 'module_path'"),
            )
        )
        .values(ignored=True)
    )


def downgrade() -> None:
    with op.batch_alter_table('problems') as batch:
        batch.drop_column('ignored')
