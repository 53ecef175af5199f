"""tensor summaries: tensors.sketch

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-27 14:00:00.000000

A capture with values="summary" keeps no element values of a tensor, only its summary: a content hash, the count,
sum, sum of squares, min, max, NaN and Inf counts, and the values at a fixed sample of positions
(engine/summary_compare.py). Pairs of such tensors are judged on it. Null for every other tensor.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tensors") as batch:
        batch.add_column(sa.Column("sketch", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tensors") as batch:
        batch.drop_column("sketch")
