"""Replicas of `serve` started at once on an empty database and an empty store, as a cluster's first start: the test
(tests/web/test_first_start.py) and bench/first_start.py (more rounds) use it."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import text
from tensor_debugger.store.arrays import ArrayStore
from tensor_debugger.store.database import create_db_engine
from tensor_debugger.store.identity import MARKER

from tests.support.polling import wait_until
from tests.support.servers import LiveServer, free_port


@dataclass(frozen=True)
class FirstStart:
    answered: int  # how many replicas answered GET /api/sessions
    exits: list[str]  # the replicas that exited instead: each one's exit status and the end of its log
    versions: list[str]  # the rows of alembic_version
    database_ids: list[str]  # the rows of database_identity
    marker: str | None  # the database id in the store's marker
    seconds: float  # from the launch to the last replica answering (or exiting)


def start_replicas_at_once(root: Path, database_url: str, env: dict[str, str], count: int) -> FirstStart:
    """Launch `count` replicas at once (one data dir each under `root`, one database and the store `env` names:
    TENSOR_DEBUGGER_STORE_URL and the AWS variables), wait until each answers or exits, stop them, and say what
    the database and the store hold."""
    servers = [
        LiveServer(root / f"replica{n}" / "data", free_port(), env=dict(env), database_url=database_url)
        for n in range(count)
    ]
    for server in servers:
        server.data_dir.mkdir(parents=True)
    started = time.monotonic()
    try:
        for server in servers:
            server.launch()
        exits: list[str] = []
        answered = 0
        for server in servers:

            def settled(server: LiveServer = server) -> bool:
                assert server.process is not None
                return server.process.poll() is not None or server.answers()

            wait_until(settled, what=f"the replica on port {server.port} to answer or exit", timeout=120, interval=0.1)
            if server.alive():
                answered += 1
            else:
                assert server.process is not None
                tail = server.log.read_text(errors="replace").strip().splitlines()[-3:]
                exits.append(f"exit {server.process.returncode}: {' | '.join(tail)}")
        seconds = time.monotonic() - started
    finally:
        for server in servers:  # their graceful stops at once, not one after another
            server.ask_to_stop()
        for server in servers:
            server.stop()
    engine = create_db_engine(database_url)
    try:
        with engine.connect() as connection:
            versions = [str(v) for v in connection.scalars(text("SELECT version_num FROM alembic_version"))]
            ids = [str(v) for v in connection.scalars(text("SELECT database_id FROM database_identity"))]
    finally:
        engine.dispose()
    store_url = env.get("TENSOR_DEBUGGER_STORE_URL") or (servers[0].data_dir / "arrays").as_uri()
    found = ArrayStore(store_url, env).read_object(MARKER)
    marker = None if found is None else str(json.loads(found)["database_id"])
    return FirstStart(answered, exits, versions, ids, marker, seconds)
