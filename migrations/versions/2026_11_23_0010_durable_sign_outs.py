"""durable sign-outs: the cookies of browser sessions signed out before they expired, refused by every process

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-23 17:30:00.000000

Sign-outs were kept in each server's memory: a cookie signed out on one replica, or before a restart, opened the
app again elsewhere. Sessions signed out before this revision are not recorded (their cookies last 12 hours).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'sign_outs',
        sa.Column('nonce', sa.String(length=64), nullable=False),
        sa.Column('expires_at', sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint('nonce', name=op.f('pk_sign_outs')),
    )
    with op.batch_alter_table('sign_outs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_sign_outs_expires_at'), ['expires_at'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('sign_outs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_sign_outs_expires_at'))
    op.drop_table('sign_outs')
