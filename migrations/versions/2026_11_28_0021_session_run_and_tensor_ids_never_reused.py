"""session, run and tensor ids never reused: their tables rebuilt with AUTOINCREMENT on SQLite

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-28 09:00:00.000000

A session's, a run's and a tensor's ids are in pages' addresses (/sessions/<id>, /runs/<id>), in the API and in an
API client's cache. Without AUTOINCREMENT, SQLite gives a new row the highest id plus one, so after the newest
session was deleted the next upload's session, runs and tensors got its ids: an old link showed another upload's
data. As 0011 did for pairs, each table is copied into one declared AUTOINCREMENT, every row and id kept (SQLite
then counts on from the highest id kept: ids of rows deleted before this revision above it may still come back
once). PostgreSQL's sequences never reuse ids; there the tables are left as they are.

Copying a table drops the old one, and with foreign keys on that DROP deletes every row pointing at it (runs,
tensors, pairs, problems): the app migrates SQLite with foreign keys off and checks them all before it commits
(store/database.py `upgrade_database`); run with them on, this revision refuses before it changes anything.
"""

from __future__ import annotations

from alembic import op


revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

TABLES = ("sessions", "runs", "tensors")


def _rebuild(autoincrement: bool) -> None:
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        return
    if bind.exec_driver_sql("PRAGMA foreign_keys").scalar():
        raise RuntimeError(
            "revision 0021 copies the sessions, runs and tensors tables: with SQLite's foreign keys on, dropping the"
            " old tables would delete every row pointing at them; run it with PRAGMA foreign_keys=OFF (as the app"
            " does); nothing was changed"
        )
    for table in TABLES:
        with op.batch_alter_table(table, recreate="always", table_kwargs={"sqlite_autoincrement": autoincrement}):
            pass


def upgrade() -> None:
    _rebuild(autoincrement=True)


def downgrade() -> None:
    _rebuild(autoincrement=False)
