"""a session's tolerance in ULPs of each pair's lower-precision dtype; error profiles kept with a result

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-23 15:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('ulp', sa.Integer(), nullable=True))
    with op.batch_alter_table('comparison_results', schema=None) as batch_op:
        batch_op.add_column(sa.Column('profiles', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('comparison_results', schema=None) as batch_op:
        batch_op.drop_column('profiles')
    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.drop_column('ulp')
