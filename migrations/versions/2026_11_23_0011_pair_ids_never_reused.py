"""pair ids never reused: the pairs table rebuilt with AUTOINCREMENT on SQLite

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-23 20:40:00.000000

A pair's id is in the address of its page and in every action on it (unpair, alignment). Without AUTOINCREMENT,
SQLite gives a new row the highest id plus one, so the ids of deleted pairs came back for other pairs: a page or an
action naming a pair that was planned away reached a different pair. PostgreSQL's sequences never reuse ids;
there the table is left as it is.
"""

from __future__ import annotations

from alembic import op


revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name == 'sqlite':
        with op.batch_alter_table('pairs', recreate='always', table_kwargs={'sqlite_autoincrement': True}):
            pass


def downgrade() -> None:
    if op.get_bind().dialect.name == 'sqlite':
        with op.batch_alter_table('pairs', recreate='always', table_kwargs={'sqlite_autoincrement': False}):
            pass
