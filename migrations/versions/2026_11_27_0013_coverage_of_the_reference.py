"""coverage of the reference: where each unmatched tensor falls, whether the user allowed it, allowed globs

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27 11:00:00.000000

A reference tensor with no partner is part of a session's verdict: the comparison is incomplete unless the user
said so. `unmatched.allowed`: the user allowed it to stay unpaired (a pairing file's `unpaired`, an unpair by hand,
a glob of `sessions.allow_unmatched`); `unmatched.before_position`: for a reference tensor, the position of the
first pair after it in execution order (one past its candidate's last pair when none is), so reports place it among
the pairs. Rows already stored get both when their session is paired again; until then they count as not allowed.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('unmatched') as batch:
        batch.add_column(sa.Column('allowed', sa.Boolean(), server_default=sa.false(), nullable=False))
        batch.add_column(sa.Column('before_position', sa.Integer(), nullable=True))
    with op.batch_alter_table('sessions') as batch:
        batch.add_column(sa.Column('allow_unmatched', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('sessions') as batch:
        batch.drop_column('allow_unmatched')
    with op.batch_alter_table('unmatched') as batch:
        batch.drop_column('before_position')
        batch.drop_column('allowed')
