"""op sources: tensors.source

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-27 12:00:00.000000

A capture with level="op" records every torch function a forward calls; each op's tensor keeps the file and line
of the code that called it ("<file>:<line>"), so that the first diverging op can be shown with its source line on
both sides. Null for every other tensor.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tensors") as batch:
        batch.add_column(sa.Column("source", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tensors") as batch:
        batch.drop_column("source")
