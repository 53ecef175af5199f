"""dimension names: sessions.dims

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-27 11:30:00.000000

A session may name the dimensions of its tensors: a name glob maps to comma-separated names
({"*attn*": "batch,heads,tokens,head_dim"}), which `where` and the error profiles use. Null: no names.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('sessions') as batch:
        batch.add_column(sa.Column('dims', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('sessions') as batch:
        batch.drop_column('dims')
