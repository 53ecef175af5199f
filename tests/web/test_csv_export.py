"""pairs.csv: a tensor name a spreadsheet would read as a formula is exported as text (a leading `'`), numbers are
left as they are (a negative SNR stays a number), and the Content-Type names one charset."""

from __future__ import annotations

import csv
import io
import re
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


def test_rows_judged_on_summaries_say_so_and_rows_not_compared_have_no_basis(
    shared_server: LiveServer, tmp_path: Path
) -> None:
    """A summary capture against a full one: a row passing on summaries says `basis` summary and its reason (no
    difference found, not every element compared; or bit-identical), a failing one its sampled max |diff| as a
    lower bound, none of them a max |diff| of values never compared."""
    import torch
    from tensor_debugger import capture

    torch.manual_seed(0)
    layers = [torch.nn.Linear(64, 64) for _ in range(3)]
    model = torch.nn.Sequential(*layers)
    x = torch.randn(32, 64)
    name = "csv on summaries"
    with (
        torch.no_grad(),
        capture(model, name, "reference", server=shared_server.url, token=shared_server.token, values="summary"),
    ):
        model(x)
    with torch.no_grad():
        layers[1].weight.mul_(1 + 1e-7)  # within tolerance: the hashes differ, no difference found
        layers[2].weight[3, 5] += 0.5  # a divergence
        with capture(model, name, "candidate", server=shared_server.url, token=shared_server.token) as sent:
            model(x)
    session_id = sent.session_id
    assert session_id is not None
    wait_done(shared_server, session_id)
    response = http.get(f"{shared_server.url}/sessions/{session_id}/pairs.csv", headers=shared_server.auth)
    assert response.status_code == 200, response.text
    rows = {row["name"]: row for row in csv.DictReader(io.StringIO(response.text))}
    first = rows["Sequential.0_outputs"]
    assert (first["status"], first["basis"], first["max_abs_diff"]) == ("pass", "summary", "")
    assert "bit-identical" in first["reason"]
    near = rows["Sequential.1_outputs"]
    assert (near["status"], near["basis"], near["max_abs_diff"]) == ("pass", "summary", ""), near
    assert "no difference found in the summary" in near["reason"] and "not every element was compared" in near["reason"]
    failing = rows["Sequential.2_outputs"]
    assert (failing["status"], failing["basis"], failing["max_abs_diff"]) == ("fail", "summary", ""), failing
    assert float(failing["sampled_max_abs_diff_lower_bound"]) > 0 and failing["reason"].startswith("from summaries: ")
    # the session page's bands: a pass on summaries is no difference found in the summary (or identical, by its
    # hashes), never "within tolerance", which its elements were never checked to be
    page = http.get(f"{shared_server.url}/sessions/{session_id}?group=band", headers=shared_server.auth).text
    heads = re.findall(r'<tr class="group-head.*?class="toggle"[^>]*>([^<]+)<', page, re.S)
    assert heads == ["Identical", "No difference found in the summary", "Failing"], heads
