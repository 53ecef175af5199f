"""problem notes: problems.note

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-27 20:30:00.000000

A capture's note about its run (the ops of a module that ran compiled, which op capture cannot see) is stored with
the run's problems, ignored (nothing is missing for it); `note` tells it from a file that held no tensor, so pages
and reports say "note", not "ignored (no tensor in it)". Existing notes were stored under their trace's name (the
file ending in _debug_tree_FULL_TENSORS.json, as the command line told them apart): those are marked.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("problems") as batch:
        batch.add_column(sa.Column("note", sa.Boolean(), server_default=sa.false(), nullable=False))
    problems = sa.table(
        "problems", sa.column("file", sa.Text()), sa.column("ignored", sa.Boolean()), sa.column("note", sa.Boolean())
    )
    op.execute(
        problems.update()
        .where(
            problems.c.ignored.is_(True),
            problems.c.file.endswith("_debug_tree_FULL_TENSORS.json", autoescape=True),
        )
        .values(note=True)
    )


def downgrade() -> None:
    with op.batch_alter_table("problems") as batch:
        batch.drop_column("note")
