"""a user's order of pairs

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21 10:11:41.470382
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('pair_order', sa.JSON(), nullable=True))



def downgrade() -> None:
    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.drop_column('pair_order')

