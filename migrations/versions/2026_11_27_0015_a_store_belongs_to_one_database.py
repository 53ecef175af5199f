"""a store belongs to one database: database_identity and array_folders

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-27 11:30:00.000000

`database_identity` holds the database's id, which the array store's marker repeats (store/identity.py): a process
given a database and a store of different pairs refuses to start. `array_folders` records each run's folder in the
store, so that recovery deletes arrays only where this database wrote them. A database from before records the
folders of its runs and those its tensor rows still name; the id is written at the next start (the store adopts it).
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op


revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'database_identity',
        sa.Column('slot', sa.Integer(), autoincrement=False, nullable=False),
        sa.Column('database_id', sa.String(length=32), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('slot', name=op.f('pk_database_identity')),
    )
    folders = op.create_table(
        'array_folders',
        sa.Column('run_id', sa.Integer(), autoincrement=False, nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('run_id', name=op.f('pk_array_folders')),
    )
    assert folders is not None
    connection = op.get_bind()
    run_ids = set(connection.execute(sa.text("SELECT id FROM runs")).scalars())
    keys = connection.execute(sa.text("SELECT DISTINCT store_key FROM tensors WHERE store_key LIKE 'runs/%'"))
    for key in keys.scalars():
        parts = str(key).split("/")
        if len(parts) >= 3 and parts[1].isdigit():
            run_ids.add(int(parts[1]))
    created = datetime.now(UTC)
    op.bulk_insert(folders, [{'run_id': run_id, 'created_at': created} for run_id in sorted(run_ids)])


def downgrade() -> None:
    op.drop_table('array_folders')
    op.drop_table('database_identity')
