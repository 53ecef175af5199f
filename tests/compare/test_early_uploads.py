"""Uploads compared while they ingest: a real server ingests an upload's runs in child processes, and each pair
whose two tensors are stored is compared then, while the rest ingests; the API and the session page show those
results before the run is ready, and the plan after the ingest finds every one of them in the cache."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import select
from tensor_debugger.settings import Settings
from tensor_debugger.store.database import create_db_engine, make_sessionmaker
from tensor_debugger.store.models import ComparisonResultRecord, PairRecord

from tests.support import loopback_http
from tests.support.polling import wait_until
from tests.support.servers import LiveServer, upload, wait_done

PAIRED = 12  # tensors of both runs, first in each archive
EXTRA = 300  # small files of the candidate only, after them: its ingest goes on long after the pairs are known
DIVERGING = 5  # the paired tensor the candidate changes


def write_zip(target: Path, candidate: bool) -> Path:
    """A run as a zip of .npy files; the seed is this test's own, so that no other test has cached the pairs."""
    rng = np.random.default_rng(15_001)
    with zipfile.ZipFile(target, "w") as archive:
        for n in range(PAIRED):
            values = rng.standard_normal((64, 48)).astype(np.float32)
            if candidate and n == DIVERGING:
                values[3, 7] += 0.5
            with archive.open(f"a_{n:03d}.npy", "w") as member:
                np.save(member, values)
        if candidate:
            for n in range(EXTRA):
                with archive.open(f"z_{n:04d}.npy", "w") as member:
                    np.save(member, np.full((4,), n, dtype=np.float32))
    return target


def test_an_upload_shows_pairs_compared_before_its_candidate_is_ready(
    shared_server: LiveServer, tmp_path: Path
) -> None:
    settings = Settings(data_dir=shared_server.data_dir, demo=False)
    engine = create_db_engine(settings.database_url)
    try:
        with make_sessionmaker(engine)() as db:
            before = set(db.scalars(select(ComparisonResultRecord.id)))
        files = [("ref", write_zip(tmp_path / "ref.zip", False)), ("cand", write_zip(tmp_path / "cand.zip", True))]
        response = upload(shared_server, "early upload", files, url="/api/sessions?wait=false")
        assert response.status_code == 202, response.text
        session_id = response.json()["session"]["id"]
        progress_url = f"{shared_server.url}/api/sessions/{session_id}/progress"
        page_url = f"{shared_server.url}/sessions/{session_id}"

        def candidate_ingesting() -> tuple[dict[str, Any], bool]:
            progress = loopback_http.get(progress_url, headers=shared_server.auth, timeout=30).json()
            candidate = next(r for r in progress["runs"] if r["role"] == "candidate")
            return progress, candidate["status"] == "ingesting"

        def early_while_ingesting() -> tuple[dict[str, Any], str, set[int]] | str:
            """The progress, the page and the results stored, once all show every paired result and the candidate
            is still ingesting after them; "too late" if it was ready first (the test then fails), else ""."""
            progress, ingesting = candidate_ingesting()
            if not ingesting:
                return "too late"
            if progress["early"]["compared"] < PAIRED:
                return ""
            with make_sessionmaker(engine)() as db:
                stored = set(db.scalars(select(ComparisonResultRecord.id))) - before
            page = loopback_http.get(page_url, headers=shared_server.auth, timeout=30).text
            if len(stored) < PAIRED or "compared while ingesting" not in page:
                return ""
            return (progress, page, stored) if candidate_ingesting()[1] else "too late"

        seen = wait_until(early_while_ingesting, what="the pairs compared while the candidate ingests", interval=0.02)
        assert seen != "too late", "the candidate was ready before its pairs were shown"
        assert isinstance(seen, tuple)
        progress, page, stored = seen
        assert progress["stage"] == "ingesting"
        assert progress["pairs"]["total"] == 0  # the plan has not made the pairs yet
        early = progress["early"]
        assert early["failing"] == 1
        assert early["words"] == f"{PAIRED} pairs compared while ingesting, 1 outside tolerance"
        statuses = {p["name"]: p["status"] for p in early["pairs"]}
        assert statuses == {f"a_{n:03d}": "fail" if n == DIVERGING else "pass" for n in range(PAIRED)}
        assert f'<span class="badge fail">fail</span> a_{DIVERGING:03d}' in page
        assert f'<span class="badge pass">pass</span> a_{DIVERGING + 1:03d}' in page

        report = wait_done(shared_server, session_id)
        verdicts = {p["name"]: p["status"] for p in report["pairs"]}
        assert verdicts == statuses  # the plan's pairs: the same verdicts
        with make_sessionmaker(engine)() as db:
            used = set(db.scalars(select(PairRecord.result_id).where(PairRecord.session_id == session_id)))
        assert len(used) == PAIRED
        assert used <= stored  # every pair's result was stored while the candidate ingested: none computed after
    finally:
        engine.dispose()
