"""module traces: each tensor's module and place, a run's module tree, summary-only pairs

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-21 14:02:10.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('tensors', schema=None) as batch_op:
        batch_op.add_column(sa.Column('module_path', sa.Text(), nullable=True))
        batch_op.add_column(sa.Column('place', sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column('has_values', sa.Boolean(), nullable=False, server_default=sa.true()))
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('module_tree', sa.JSON(), nullable=True))
    with op.batch_alter_table('pairs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('module_path', sa.Text(), nullable=True))
        batch_op.add_column(sa.Column('place', sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column('summary', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('pairs', schema=None) as batch_op:
        batch_op.drop_column('summary')
        batch_op.drop_column('place')
        batch_op.drop_column('module_path')
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_column('module_tree')
    with op.batch_alter_table('tensors', schema=None) as batch_op:
        batch_op.drop_column('has_values')
        batch_op.drop_column('place')
        batch_op.drop_column('module_path')
