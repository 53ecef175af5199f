"""noise floor: a session's noise factor (a run's role may now be "noise": a rerun of the reference)

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23 15:45:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('noise_factor', sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.drop_column('noise_factor')
