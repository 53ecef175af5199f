"""pairs.csv: a tensor name a spreadsheet would read as a formula is exported as text (a leading `'`), numbers are
left as they are (a negative SNR stays a number), and the Content-Type names one charset."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np

from tests.support import loopback_http as http
from tests.support.servers import LiveServer, upload, wait_done


def test_formula_like_names_are_exported_as_text(shared_server: LiveServer, tmp_path: Path) -> None:
    names = ["=1+2", "@SUM(A1)", "+cmd", "-x", "plain"]
    runs: list[tuple[str, Path]] = []
    for run, scale in (("ref", 1.0), ("cand", 11.0)):  # the candidate's error is 10x its signal: SNR -20 dB
        folder = tmp_path / run
        folder.mkdir()
        for i, name in enumerate(names):
            np.save(folder / f"{name}.npy", np.arange(1, 9, dtype=np.float32) * scale + i)
        runs.extend((run, folder / f"{name}.npy") for name in names)
    made = upload(shared_server, "csv injection", runs)
    assert made.status_code == 201, made.text
    session_id = made.json()["session"]["id"]
    wait_done(shared_server, session_id)
    response = http.get(f"{shared_server.url}/sessions/{session_id}/pairs.csv")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/csv; charset=utf-8"
    rows = list(csv.DictReader(io.StringIO(response.text)))
    exported = sorted(row["name"] for row in rows)
    assert exported == sorted(["'=1+2", "'@SUM(A1)", "'+cmd", "'-x", "plain"]), exported
    assert {row["reference"] for row in rows} == set(exported)
    snrs = [float(row["snr_db"]) for row in rows]  # numbers, not text: no quote before the minus
    assert all(s < 0 for s in snrs), snrs
    assert all(not row["snr_db"].startswith("'") for row in rows)
