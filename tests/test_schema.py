"""Alembic's `upgrade head` on an empty database gives exactly the models' schema."""

from __future__ import annotations

from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect
from tensor_debugger.database import create_db_engine, upgrade_database
from tensor_debugger.models import Base


def test_upgrade_head_matches_models(tmp_path: Path) -> None:
    engine = create_db_engine(f"sqlite:///{tmp_path / 'fresh.sqlite3'}")
    upgrade_database(engine)
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []
    assert set(inspect(engine).get_table_names()) == {
        "alembic_version", "sessions", "runs", "tensors", "problems", "pairs", "comparison_results", "pair_overrides",
        "unmatched"}
    upgrade_database(engine)  # a second start is a no-op
    engine.dispose()
