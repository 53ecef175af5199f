"""The next capture's snippet (find_divergence's `next_capture`, `compare --json`'s `next_capture.python`), run as
printed, adds its runs to the same session, each compared against the right run: the new candidate run against its
counterpart (the new full run of the model it was compared against), not the session's reference, wherever the
candidate that diverged is compared against another run (`capture(against=)`, `ingest --against`,
find_divergence's "candidate (full)" against "reference (full)")."""

from __future__ import annotations

import html
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from sqlalchemy import select
from tensor_debugger import capture, find_divergence
from tensor_debugger.compare.reports.contract import compare_report
from tensor_debugger.compare.reports.pair_reports import SessionPairs
from tensor_debugger.services import open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store.models import RunRecord, SessionRecord

from tests.support import loopback_http as http
from tests.support.reordered_attention import ATTN, Net, x_input
from tests.support.servers import LiveServer, child_env, wait_done
from tests.support.sessions import compared, session_id_of


def runs_of(settings: Settings, session: str) -> dict[str, tuple[int, int | None]]:
    """The session's runs by label: (id, the id of the run it is compared against; None: the reference)."""
    services = open_services(settings)
    try:
        with services.sessions() as db:
            rows = db.execute(
                select(RunRecord.label, RunRecord.id, RunRecord.compared_against_id)
                .join(SessionRecord)
                .where(SessionRecord.name == session)
            ).all()
    finally:
        services.close()
    return {label: (run_id, against) for label, run_id, against in rows}


def full_pair(report: SessionPairs, run_id: int, name: str) -> tuple[int, str, bool]:
    """The pair of candidate run `run_id` at reference tensor `name`: (its reference side's run, its status, whether
    it was compared element by element)."""
    pair = next(p for p in report.pairs if p.b.run_id == run_id and p.name == name)
    return pair.a.run_id, str(pair.status), pair.stats is not None


def test_find_divergences_next_capture_compares_the_new_candidate_run_with_the_new_reference_run(
    settings: Settings,
) -> None:
    """find_divergence stores "candidate (full)" compared against "reference (full)"; its snippet's candidate run
    was compared against the session's reference (its summaries). Run as printed, "candidate (full, 2)" is
    compared against "reference (full, 2)", element by element, and fails where find_divergence's answer
    did."""
    found = find_divergence(
        Net().eval(), Net("qkv", "k").eval(), (x_input(),), session="again", data_dir=settings.data_dir
    )
    assert found.first is not None and found.next_capture is not None
    assert "run='candidate (full, 2)'" in found.next_capture
    assert "against='reference (full, 2)'" in found.next_capture
    exec(found.next_capture, {"reference": Net().eval(), "candidate": Net("qkv", "k").eval(), "inputs": (x_input(),)})
    runs = runs_of(settings, "again")
    assert runs["candidate (full, 2)"][1] == runs["reference (full, 2)"][0], runs
    assert runs["reference (full, 2)"][1] is None  # against the reference, as "reference (full)" is
    report = compared(settings, "again", modules=True)
    against, status, element_wise = full_pair(report, runs["candidate (full, 2)"][0], found.first.reference)
    assert (against, status, element_wise) == (runs["reference (full, 2)"][0], "fail", True)
    again = next(c for c in report.candidates if c.label == "candidate (full, 2)")
    assert again.first_divergence is not None and again.first_divergence.name == found.first.reference


def test_a_sessions_next_capture_compares_the_diverging_module_on_full_values_on_both_sides(
    tmp_path: Path,
) -> None:
    """Two summary captures, the candidate against the session's reference (the default). The next capture's
    snippet (`compare --json`'s, the CLI's and the page's: one function) adds "reference (full)" and "candidate
    (full)" compared against it: run as printed, the first divergence's op pairs full values with full values,
    element by element, with a `where` (against the reference's summaries it had none). Run as printed again, its
    runs take free labels ("(full, 2)") where the first ones would clash."""
    data = tmp_path / "data"
    x = x_input()
    for model, run in ((Net(), "reference"), (Net("qkv", "q"), "candidate")):
        with torch.no_grad(), capture(model.eval(), "ports", run, data_dir=data, level="op", values="summary"):
            model(x)
    settings = Settings(data_dir=data, demo=False)
    session_id = session_id_of(settings, "ports")
    report = compared(settings, session_id, modules=True)
    assert report.first_divergence is not None and report.first_divergence.basis == "summary"
    name = report.first_divergence.name
    assert name == f"{ATTN}/linear#1_outputs"  # q's projection, the planted bug
    where = f", data_dir={str(data)!r}"
    typed = compare_report(session_id, "ports", "http://127.0.0.1/sessions/1", report, [], where)
    assert typed.next_capture is not None
    python = typed.next_capture.python
    assert "run='reference (full)'" in python and "run='candidate (full)'" in python, python
    assert "against='reference (full)')" in python, python
    models = {"reference": Net().eval(), "candidate": Net("qkv", "q").eval(), "inputs": x}
    exec(python, dict(models))
    runs = runs_of(settings, "ports")
    assert runs["candidate (full)"][1] == runs["reference (full)"][0] and runs["reference (full)"][1] is None, runs
    report = compared(settings, session_id, modules=True)
    pair = next(p for p in report.pairs if p.b.run_id == runs["candidate (full)"][0] and p.name == name)
    assert (pair.a.run_id, str(pair.status)) == (runs["reference (full)"][0], "fail")
    # element by element, its `where` computed: [] (the scaled weight's error is everywhere, in no one head)
    assert pair.stats is not None and pair.summary is None and pair.where == [], pair
    full = next(c for c in report.candidates if c.label == "candidate (full)").first_divergence
    assert full is not None and (full.name, full.basis, full.where) == (name, None, [])
    summary_pair = next(p for p in report.pairs if p.b.run_id == runs["candidate"][0] and p.name == name)
    assert summary_pair.where is None  # on summaries: no `where`

    again = compare_report(session_id, "ports", "http://127.0.0.1/sessions/1", report, [], where).next_capture
    assert again is not None
    assert "run='candidate (full, 2)'" in again.python, again.python
    assert "against='reference (full, 2)')" in again.python, again.python
    exec(again.python, dict(models))
    runs = runs_of(settings, "ports")
    assert runs["candidate (full, 2)"][1] == runs["reference (full, 2)"][0], runs


def test_compares_next_capture_follows_a_candidate_compared_against_another_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session of summary captures: "reference", "early" (a port, against the reference) and "late" (the next
    version of the port, wrong, compared against "early"). The answer's snippet adds "early (full)" against "early"
    and "late (full)" against "early (full)": run as printed, "late (full)" pairs with the full values of the model it
    is compared against, element by element, and fails at the same op."""
    data = tmp_path / "data"
    monkeypatch.setenv("TENSOR_DEBUGGER_DATA_DIR", str(data))  # the snippet's capture(), with no data_dir=
    x = x_input()
    for model, run, against in (
        (Net(), "reference", None),
        (Net(), "early", None),
        (Net("qkv", "k"), "late", "early"),
    ):
        with (
            torch.no_grad(),
            capture(model.eval(), "versions", run, data_dir=data, level="op", values="summary", against=against),
        ):
            model(x)
    settings = Settings(data_dir=data, demo=False)
    session_id = session_id_of(settings, "versions")
    report = compared(settings, session_id, modules=True)
    late = next(c for c in report.candidates if c.label == "late")
    assert late.against == "early" and late.first_divergence is not None
    typed = compare_report(session_id, "versions", "http://127.0.0.1/sessions/1", report, [])
    assert typed.next_capture is not None
    python = typed.next_capture.python
    assert "run='early (full)'" in python and "against='early')" in python, python
    assert "run='late (full)'" in python and "against='early (full)')" in python, python
    exec(python, {"reference": Net().eval(), "candidate": Net("qkv", "k").eval(), "inputs": x})
    runs = runs_of(settings, "versions")
    assert runs["early (full)"][1] == runs["early"][0] and runs["late (full)"][1] == runs["early (full)"][0], runs
    report = compared(settings, session_id, modules=True)
    name = late.first_divergence.name
    assert name == f"{ATTN}/linear#2_outputs"
    assert full_pair(report, runs["late (full)"][0], name) == (runs["early (full)"][0], "fail", True)
    assert full_pair(report, runs["early (full)"][0], name)[1:] == ("pass", False)  # full against early's summary


def test_the_session_page_gives_the_next_capture_into_its_server_and_it_runs_as_printed(
    shared_server: LiveServer,
) -> None:
    """The same session of versions captured into a server: its page gives the snippet under the first divergence
    (`late`'s, against `early`), storing into that server; run as printed, "late (full)" is compared against
    "early (full)" there, element by element, and fails at the same op."""
    x = x_input()
    session = "versions on a server"
    for model, run, against in ((Net(), "reference", None), (Net(), "early", None), (Net("qkv", "k"), "late", "early")):
        with (
            torch.no_grad(),
            capture(
                model.eval(), session, run, server=shared_server.url, level="op", values="summary", against=against
            ) as result,
        ):
            model(x)
    assert result.session_id is not None
    session_id = result.session_id
    wait_done(shared_server, session_id)
    page = http.get(f"{shared_server.url}/sessions/{session_id}", headers=shared_server.auth).text
    found = re.search(r'<details class="next-capture" id="next-capture">.*?<pre><code>(.*?)</code></pre>', page, re.S)
    assert found is not None, page
    python = html.unescape(found[1])
    assert f"server={shared_server.url!r}" in python and "against='early (full)')" in python, python
    # the model was called with one tensor: passed as one argument, never unpacked along its first dimension
    assert "# inputs: the model's one positional argument (a tensor)" in python and "    reference(inputs)" in python
    exec(python, {"reference": Net().eval(), "candidate": Net("qkv", "k").eval(), "inputs": x})
    runs = {
        r["label"]: r
        for r in http.get(f"{shared_server.url}/api/sessions/{session_id}", headers=shared_server.auth).json()["runs"]
    }
    assert runs["late (full)"]["compared_against"] == runs["early (full)"]["id"], runs
    assert runs["early (full)"]["compared_against"] == runs["early"]["id"], runs
    report = wait_done(shared_server, session_id)
    pair = next(
        p
        for p in report["pairs"]
        if p["b"]["run_id"] == runs["late (full)"]["id"] and p["name"] == f"{ATTN}/linear#2_outputs"
    )
    assert (pair["a"]["run_id"], pair["status"]) == (runs["early (full)"]["id"], "fail")
    assert pair["stats"] is not None and pair["summary"] is None  # element by element


def test_find_divergences_snippet_names_the_default_data_dir_it_stored_into(tmp_path: Path) -> None:
    """Without `data_dir=`, find_divergence stores into the environment's data dir; its snippet names that folder
    (`data_dir=`), so run in another shell (another TENSOR_DEBUGGER_DATA_DIR, none) it adds its runs to the same
    session, as `compare`'s snippet names its data dir."""
    code = (
        "from tensor_debugger import find_divergence\n"
        "from tests.support.reordered_attention import Net, x_input\n"
        "found = find_divergence(Net().eval(), Net('qkv', 'k').eval(), (x_input(),), session='default dir')\n"
        "print(found.next_capture)\n"
    )
    data = tmp_path / "from env"
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**child_env(), "TENSOR_DEBUGGER_DATA_DIR": str(data)},
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"data_dir={str(data)!r}" in done.stdout, done.stdout
