"""module input parameters: tensors.parameter

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-28 19:00:00.000000

A capture records, for each module input it keeps, the parameter of the module's `forward` the argument binds to
(`x` for `self.attn(h)` and for `self.attn(x=h)` alike), so that a session pairs an input passed by keyword on one
side with the one passed by position on the other, as find_divergence does. Null for every other tensor, and for
Hugging Face traces (which do not record it).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tensors") as batch:
        batch.add_column(sa.Column("parameter", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tensors") as batch:
        batch.drop_column("parameter")
