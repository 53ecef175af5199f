"""A `compare` whose session a server on the same data dir deletes (its API's DELETE) while it runs: it says the
session was deleted and that there is no verdict (exit 2), not that no tensor could be paired."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import torch

from tests.support import loopback_http
from tests.support.servers import LiveServer, child_env, cli_command


def test_a_session_deleted_while_compared_has_no_verdict(shared_server: LiveServer, tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(0)
    for side in ("a", "b"):
        (tmp_path / side).mkdir()
    for n in range(24):
        tensor = torch.randn(1024, 1024, generator=generator)
        torch.save(tensor, tmp_path / "a" / f"{n}_query.pth")
        torch.save(tensor + (n == 20), tmp_path / "b" / f"{n}_query.pth")
    name = "deleted while compared"
    args = ["--data-dir", str(shared_server.data_dir), "compare", str(tmp_path / "a"), str(tmp_path / "b")]
    env = {**child_env(), **shared_server.env}
    process = subprocess.Popen(
        [*cli_command(), *args, "--name", name, "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    deleted = False
    try:
        while not deleted and process.poll() is None:
            listed = loopback_http.get(f"{shared_server.url}/api/sessions", headers=shared_server.auth, timeout=30)
            for session in listed.json():
                if session["name"] == name:
                    url = f"{shared_server.url}/api/sessions/{session['id']}"
                    deleted = loopback_http.delete(url, headers=shared_server.auth, timeout=30).status_code == 204
            time.sleep(0.02)
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert deleted, "the compare ended before its session could be deleted"
    assert process.returncode == 2, err
    report = json.loads(out)
    assert report["error"] == (
        f"session {name!r} was deleted while it was compared (a server's DELETE or its page's Delete): nothing of it "
        "is kept, and there is no verdict"
    )
    assert report["verdict"] == "incomplete" and report["pairs"] == []
