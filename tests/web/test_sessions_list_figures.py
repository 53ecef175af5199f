"""The sessions list's figures of a session with a rerun (role "noise"), judged as its page judges them, are kept
with a fingerprint of what they were judged from (store/session_figures.py): a repeat load of the list reads no
session's pairs again, and every change to the session (new tolerances, a hand pairing, a new run) shows on the
next load, the figures then those of the session's own report."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from litestar import Litestar
from litestar.testing import TestClient
from sqlalchemy import event
from tensor_debugger.compare.reports.pair_reports import session_pairs
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.services import Services
from tensor_debugger.settings import Settings
from tensor_debugger.store.models import SessionFiguresRecord
from tensor_debugger.web.app import create_app

from tests.support.postgres import DATABASES

LAYERS = 4
BASE = {
    f"{layer}_{stage}": torch.randn(8, 16, generator=torch.Generator().manual_seed(2 * layer + k))
    for layer in range(LAYERS)
    for k, stage in enumerate(("attn", "mlp"))
}


def _ingest(services: Services, root: Path, label: str, shift: dict[int, float], role: str | None = None) -> int:
    """A run of `{layer}_{stage}.pth` dumps: the seeded values, each layer's moved by `shift[layer]` where given,
    into session "figures" (its pairs planned again)."""
    folder = root / label
    folder.mkdir()
    for name, tensor in BASE.items():
        torch.save(tensor + shift.get(int(name.split("_")[0]), 0.0), folder / f"{name}.pth")
    files = [InputFile(folder / f"{name}.pth", f"{name}.pth") for name in BASE]
    session_id: int = services.ingestor.ingest("figures", label, files, reuse=False, role=role).session_id
    services.plan(session_id)
    return session_id


@pytest.fixture
def client(settings: Settings, services: Services) -> Iterator[TestClient[Litestar]]:
    with TestClient(create_app(settings, services), base_url="http://127.0.0.1") as test_client:
        yield test_client


class PairReads:
    """How many times a session's pairs were read whole (`pair_rows.read_pairs`: in execution order), as judging
    a session for the list does: counted on the real database connection."""

    def __init__(self, services: Services) -> None:
        self.count = 0
        event.listen(services.engine, "before_cursor_execute", self._seen)

    def _seen(self, *args: Any) -> None:
        statement = str(args[2])
        if statement.lstrip().upper().startswith("SELECT") and "ORDER BY pairs.position" in statement:
            self.count += 1

    def during(self, action: Any) -> int:
        before = self.count
        action()
        return self.count - before


def _listed(client: TestClient[Litestar], session_id: int) -> tuple[int, str]:
    """The list's failing count and first divergence cell (its text) of the session."""
    page = client.get("/")
    assert page.status_code == 200
    row = re.search(rf'<a href="/sessions/{session_id}">.*?</tr>', page.text, re.S)
    assert row is not None
    failing = re.search(r"(\d+) failing", row.group(0))
    first = re.findall(r"<td>(.*?)</td>", row.group(0), re.S)[1]
    return (int(failing.group(1)) if failing else 0), re.sub(r"<[^>]+>", "", first).strip()


def _judged(services: Services, session_id: int) -> tuple[int, str]:
    """The session's own report's figures (as its page shows them), computed now."""
    services.compute(session_id)
    with services.sessions() as db:
        report = session_pairs(db, session_id)
    first = report.first_divergence
    return report.progress.failing, first.name if first is not None else "—"


@pytest.mark.parametrize("database_url", DATABASES, indirect=True)
def test_a_repeat_load_reads_no_pairs_and_every_change_shows(
    services: Services, client: TestClient[Litestar], tmp_path: Path
) -> None:
    # the rerun: bit-identical in layers 0 and 1 (a floor of zero: the tolerances judge there), 1e-4 off in 2 and 3;
    # the candidate: 1e-3 off in layers 0 and 1 (fails float32's tolerances), 0.5 off in 2 and 3 (fails the noise)
    _ingest(services, tmp_path, "reference", {})
    _ingest(services, tmp_path, "rerun", {2: 1e-4, 3: 1e-4}, role="noise")
    session_id = _ingest(services, tmp_path, "candidate", {0: 1e-3, 1: 1e-3, 2: 0.5, 3: 0.5})
    reads = PairReads(services)
    judged = _judged(services, session_id)
    assert judged == (8, "0_attn"), judged

    seen: list[tuple[int, str]] = []
    assert reads.during(lambda: seen.append(_listed(client, session_id))) == 1  # judged once, and kept
    assert seen[-1] == judged
    assert reads.during(lambda: seen.append(_listed(client, session_id))) == 0  # before: judged on every load
    assert seen[-1] == judged
    with services.sessions() as db:
        kept = db.get(SessionFiguresRecord, session_id)
        assert kept is not None and kept.failing == judged[0]

    # new tolerances: the pairs the noise rule leaves to them (layers 0 and 1) pass
    services.actions.update_session(session_id, rtol=0.1, atol=0.1)
    changes = [_judged(services, session_id)]
    assert changes[-1] == (4, "2_attn"), changes
    assert reads.during(lambda: seen.append(_listed(client, session_id))) == 1
    assert seen[-1] == changes[-1]

    # a hand pairing: the first divergence undone
    with services.sessions() as db:
        first = session_pairs(db, session_id).first_divergence
    assert first is not None
    services.actions.unpair(first.pair_id)
    changes.append(_judged(services, session_id))
    assert changes[-1] == (3, "2_mlp"), changes
    assert reads.during(lambda: seen.append(_listed(client, session_id))) == 1
    assert seen[-1] == changes[-1]

    # a new run: a second candidate with the bug (its layers 2 and 3 fail), its failing pairs counted too
    _ingest(services, tmp_path, "candidate 2", {2: 0.5, 3: 0.5})
    changes.append(_judged(services, session_id))
    assert changes[-1] == (7, "2_mlp"), changes
    assert reads.during(lambda: seen.append(_listed(client, session_id))) == 1
    assert seen[-1] == changes[-1]
    assert reads.during(lambda: seen.append(_listed(client, session_id))) == 0
    assert seen[-1] == changes[-1]


def test_the_list_does_not_wait_on_a_writer_to_keep_its_figures(
    services: Services, settings: Settings, client: TestClient[Litestar], tmp_path: Path
) -> None:
    """While another connection holds SQLite's writer lock (a long ingest's transaction, say), the list shows the
    judged figures and keeps none (its keeping waits 100 ms, not the 30 s a writer waits); once the lock is free,
    the next load keeps them."""
    _ingest(services, tmp_path, "reference", {})
    _ingest(services, tmp_path, "rerun", {2: 1e-4, 3: 1e-4}, role="noise")
    session_id = _ingest(services, tmp_path, "candidate", {0: 1e-3, 1: 1e-3, 2: 0.5, 3: 0.5})
    judged = _judged(services, session_id)
    writer = sqlite3.connect(settings.data_dir / "metadata.sqlite3", isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")
        assert _listed(client, session_id) == judged
        with services.sessions() as db:
            assert db.get(SessionFiguresRecord, session_id) is None
    finally:
        writer.close()
    assert _listed(client, session_id) == judged
    with services.sessions() as db:
        kept = db.get(SessionFiguresRecord, session_id)
        assert kept is not None and (kept.failing, kept.first_divergence) == judged
