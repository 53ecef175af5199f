"""Which run is the reference, and two ingests racing for one new session: on real processes."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.services import Services
from tensor_debugger.store import catalog

from tests.support import loopback_http
from tests.support.cli_main import main_cli
from tests.support.dumps import named_dump
from tests.support.polling import wait_until
from tests.support.servers import LiveServer, cli_command


def test_two_cli_ingests_creating_one_session_both_land(tmp_path: Path) -> None:
    data = tmp_path / "data"
    dumps = [named_dump(tmp_path / label, ["0_query", "0_key"], seed=n) for n, label in enumerate(("a", "b"))]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSOR_DEBUGGER_")}
    children = [  # started together: both find no session "raced" and make it
        subprocess.Popen(
            [*cli_command(), "--data-dir", str(data), "ingest", "--session", "raced", "--run", d.name, str(d)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for d in dumps
    ]
    for child in children:
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
        assert "of session 'raced'" in out
    listed = main_cli("--data-dir", str(data), "sessions", "--json")
    [session] = json.loads(listed.stdout)
    assert sorted(r["label"] for r in session["runs"]) == ["a", "b"]
    assert [r["role"] for r in session["runs"]] == ["reference", "candidate"]


def test_reference_is_the_run_sent_first_not_the_first_ingested(shared_server: LiveServer, tmp_path: Path) -> None:
    big, tiny = tmp_path / "big", tmp_path / "tiny"
    big.mkdir()
    tiny.mkdir()
    rng = np.random.default_rng(0)
    np.save(big / "0_query.npy", rng.standard_normal((32, 1024, 1024), dtype=np.float32))  # 128 MiB
    np.save(tiny / "0_query.npy", rng.standard_normal((4, 4), dtype=np.float32))
    made = loopback_http.post(shared_server.url + "/api/sessions", json={"name": "big first"})
    session_id = made.json()["id"]
    for label, folder in (("big", big), ("tiny", tiny)):
        with open(folder / "0_query.npy", "rb") as f:
            sent = loopback_http.post(
                f"{shared_server.url}/api/sessions/{session_id}/runs",
                params={"label": label, "wait": "false"},
                files=[("run", ("0_query.npy", f))],
                timeout=120,
            )
        assert sent.status_code == 202, sent.text
    session_url = f"{shared_server.url}/api/sessions/{session_id}"
    runs = wait_until(
        lambda: loopback_http.get(session_url).json()["runs"],
        until=lambda runs: runs[1]["status"] == "ready" or runs[0]["status"] == "ready",
        what="a run to be ingested",
        timeout=120,
    )
    if runs[0]["status"] != "ready":  # the tiny run finished first: it must not be compared with anything yet
        assert loopback_http.get(session_url + "/pairs").json()["pairs"] == []
    runs = wait_until(
        lambda: loopback_http.get(session_url).json()["runs"],
        until=lambda runs: all(r["status"] == "ready" for r in runs),
        what="both runs to be ingested",
        timeout=120,
    )
    assert [(r["label"], r["role"]) for r in runs] == [("big", "reference"), ("tiny", "candidate")]


def test_a_run_labelled_reference_goes_first(services: Services, tmp_path: Path) -> None:
    for label in ("candidate", "other", "reference"):
        folder = named_dump(tmp_path / label, ["0_query"])
        services.ingestor.ingest("labelled", label, [InputFile(folder, label)])
    with services.sessions() as db:
        [session] = catalog.list_sessions(db)
        assert [(r.label, r.role, r.position) for r in session.runs] == [
            ("reference", "reference", 0),
            ("candidate", "candidate", 1),
            ("other", "candidate", 2),
        ]
