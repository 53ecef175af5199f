"""A test's SQLite file taken to a given Alembic revision, as the app migrates SQLite: with foreign keys off, since
a migration that copies a table drops the old one, and with them on that DROP deletes every row pointing at it
(store/database.py `_upgrade_sqlite`)."""

from __future__ import annotations

from alembic import command
from sqlalchemy import Engine
from tensor_debugger.store.database import alembic_config


def migrate_to(engine: Engine, revision: str, downgrade: bool = False) -> None:
    """Upgrade (or, with `downgrade`, downgrade) the SQLite database of `engine` to `revision`."""
    config = alembic_config(engine.url.render_as_string(hide_password=False))
    with engine.connect() as connection:
        connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
        connection.commit()
        with connection.begin():
            config.attributes["connection"] = connection
            (command.downgrade if downgrade else command.upgrade)(config, revision)
        connection.exec_driver_sql("PRAGMA foreign_keys=ON")
        connection.commit()
