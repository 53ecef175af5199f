"""A pair's id names the same pair for as long as it exists: planned again it keeps its id, and no other pair is
ever given the id of a pair planned away (pair pages and actions name pairs by id)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select, text
from tensor_debugger.compare.planning.plan import plan_session
from tensor_debugger.compare.reports.pair_reports import session_pairs
from tensor_debugger.errors import NotFoundError
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.services import Services
from tensor_debugger.store import catalog
from tensor_debugger.store.models import PairRecord

from tests.support.dumps import layered_dump
from tests.support.postgres import DATABASES


def new_session(services: Services, tmp_path: Path, name: str) -> int:
    runs = {run: layered_dump(tmp_path / name / run, bug) for run, bug in (("ref", None), ("cand", 2))}
    session_id = 0
    for run, folder in runs.items():
        inputs = [InputFile(p, f"{run}/{p.name}") for p in sorted(folder.iterdir())]
        session_id = services.ingestor.ingest(name, run, inputs, reuse=False).session_id
    plan_session(services.context, session_id)
    services.compute(session_id)
    return session_id


def ids_by_name(services: Services, session_id: int) -> dict[str, int]:
    with services.sessions() as db:
        return {p.name: p.id for p in session_pairs(db, session_id).pairs}


@pytest.mark.parametrize("database_url", DATABASES, indirect=True)
def test_a_pair_planned_again_keeps_its_id_and_a_removed_one_is_gone(services: Services, tmp_path: Path) -> None:
    session_id = new_session(services, tmp_path, "ids")
    before = ids_by_name(services, session_id)
    assert len(before) == 8

    services.actions.set_tolerances(session_id, rtol=1.0, atol=1.0, ulp=None)  # planned again: every verdict pass
    assert ids_by_name(services, session_id) == before
    services.compute(session_id)
    with services.sessions() as db:
        assert {p.status for p in session_pairs(db, session_id).pairs} == {"pass"}

    services.actions.unpair(before["3_mlp"])
    after = ids_by_name(services, session_id)
    assert after == {name: i for name, i in before.items() if name != "3_mlp"}
    with pytest.raises(NotFoundError):  # the highest id, gone: an action naming it reaches no other pair
        services.actions.unpair(before["3_mlp"])
    with pytest.raises(NotFoundError):
        services.actions.set_alignment(before["3_mlp"], [])


@pytest.mark.parametrize("database_url", DATABASES, indirect=True)
def test_ids_of_deleted_pairs_are_never_given_to_new_pairs(services: Services, tmp_path: Path) -> None:
    first = new_session(services, tmp_path, "first")
    old_ids = set(ids_by_name(services, first).values())
    with services.sessions() as db:  # its pairs held the highest ids
        catalog.delete_session(db, services.store, first)
    with services.sessions() as db:
        assert db.scalars(select(PairRecord.id)).all() == []
    second = new_session(services, tmp_path, "second")
    new_ids = set(ids_by_name(services, second).values())
    assert len(new_ids) == 8 and not new_ids & old_ids
    if services.engine.dialect.name == "sqlite":
        with services.engine.connect() as connection:
            sql: str = connection.execute(text("SELECT sql FROM sqlite_master WHERE name = 'pairs'")).scalar_one()
        assert "AUTOINCREMENT" in sql
