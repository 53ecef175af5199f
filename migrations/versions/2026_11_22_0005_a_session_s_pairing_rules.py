"""a session's pairing rules: its chain of strategies and its name pattern

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22 09:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('strategies', sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column('name_pattern', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.drop_column('name_pattern')
        batch_op.drop_column('strategies')
