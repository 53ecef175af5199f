"""A run compared against another run of its session, not the reference: added with `ingest --against RUN` (in the
CLI's process, and sent to a server, whose upload takes `?against=`), changed with PUT
/api/runs/{id}/compared-against, refused with the reason where it cannot be (another session's run, itself, the
reference, a cycle, a label the session does not have)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from tensor_debugger.errors import InvalidInputError
from tensor_debugger.live.capture_types import CaptureResult
from tensor_debugger.live.recorder import capture
from tensor_debugger.services import open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store.models import PairRecord, RunRecord
from torch import nn

from tests.support import loopback_http
from tests.support.cli_main import main_cli
from tests.support.dumps import layered_dump
from tests.support.polling import wait_until
from tests.support.servers import LiveServer, upload, wait_done


def dumps(root: Path) -> dict[str, Path]:
    """A reference; "early", 0.5 off from layer 2 on; "late", 0.5 off from layer 3 on: against the reference, late
    first diverges at layer 3, against early at layer 2 (where early is off and late is not)."""
    return {
        "reference": layered_dump(root / "reference", None),
        "early": layered_dump(root / "early", bug_from=2),
        "late": layered_dump(root / "late", bug_from=3),
    }


def firsts(report: dict[str, Any]) -> dict[str, tuple[str | None, int | None]]:
    """Each candidate's (label of the run it is compared against, layer of its first divergence)."""
    return {
        c["label"]: (c["against"], c["first_divergence"]["layer"] if c["first_divergence"] else None)
        for c in report["candidates"]
    }


def test_a_run_added_against_another_run_and_changed_back_through_the_server(
    shared_server: LiveServer, tmp_path: Path
) -> None:
    runs = dumps(tmp_path)
    name = f"against {tmp_path.name}"
    sent = {}
    for label, extra in (("reference", ()), ("early", ()), ("late", ("--against", "early"))):
        done = main_cli(
            "ingest",
            "--server",
            shared_server.url,
            "--session",
            name,
            "--run",
            label,
            *extra,
            str(runs[label]),
            "--json",
        )
        assert done.returncode == 0, done.stderr
        sent[label] = json.loads(done.stdout)
    session_id = sent["late"]["session"]["id"]
    wait_done(shared_server, session_id)
    api = f"{shared_server.url}/api"

    def report() -> dict[str, Any]:
        return wait_done(shared_server, session_id)

    ids = {label: sent[label]["run"]["id"] for label in sent}
    got = report()
    assert firsts(got) == {"early": ("reference", 2), "late": ("early", 2)}
    late_pairs = [p for p in got["pairs"] if p["b"]["run_id"] == ids["late"]]
    assert late_pairs and {p["a"]["run_id"] for p in late_pairs} == {ids["early"]}
    shown = loopback_http.get(f"{api}/runs/{ids['late']}", headers=shared_server.auth).json()
    assert shown["compared_against"] == ids["early"]

    def put(run: str, against: int | None) -> Any:
        return loopback_http.put(
            f"{api}/runs/{ids[run]}/compared-against", json={"run_id": against}, headers=shared_server.auth
        )

    # refused, with the reason, and nothing changed
    refusals = {
        ("early", ids["late"]): "that makes a cycle ('early' -> 'late' -> 'early')",
        ("late", ids["late"]): "cannot be compared against itself",
        ("reference", ids["early"]): "is the session's reference",
    }
    for (run, against), why in refusals.items():
        answer = put(run, against)
        assert answer.status_code == 400 and why in answer.json()["detail"], answer.text
    other = main_cli(
        "ingest", "--server", shared_server.url, "--session", f"{name} other", "--run", "x", str(runs["late"])
    )
    assert other.returncode == 0, other.stderr
    other_session = next(
        s
        for s in loopback_http.get(f"{api}/sessions", headers=shared_server.auth).json()
        if s["name"] == f"{name} other"
    )
    other_run = loopback_http.get(f"{api}/sessions/{other_session['id']}", headers=shared_server.auth).json()["runs"][0]
    answer = put("late", other_run["id"])
    assert answer.status_code == 400 and "that run is of another session" in answer.json()["detail"]
    assert put("late", 10**12).status_code == 404
    missing = main_cli(
        "ingest",
        "--server",
        shared_server.url,
        "--session",
        name,
        "--run",
        "more",
        "--against",
        "nope",
        str(runs["late"]),
    )
    assert missing.returncode != 0 and "has no run labelled 'nope' to compare against" in missing.stderr
    assert firsts(report()) == {"early": ("reference", 2), "late": ("early", 2)}

    # back to the reference: its pairs are against the reference's tensors again
    answer = put("late", None)
    assert answer.status_code == 200 and answer.json()["compared_against"] is None
    got = report()
    assert firsts(got) == {"early": ("reference", 2), "late": ("reference", 3)}
    assert {p["a"]["run_id"] for p in got["pairs"] if p["b"]["run_id"] == ids["late"]} == {ids["reference"]}
    page = loopback_http.get(f"{shared_server.url}/sessions/{session_id}", headers=shared_server.auth).text
    assert "compared-against" not in page
    assert put("late", ids["early"]).status_code == 200
    page = loopback_http.get(f"{shared_server.url}/sessions/{session_id}", headers=shared_server.auth).text
    assert 'compared against <a href="/runs/' in page and ", not the reference</span>" in page


def test_ingest_against_in_the_clis_process_pairs_the_run_with_that_run(tmp_path: Path) -> None:
    runs = dumps(tmp_path)
    data = tmp_path / "data"

    def ingest(label: str, *extra: str) -> Any:
        return main_cli("--data-dir", str(data), "ingest", "--session", "s", "--run", label, *extra, str(runs[label]))

    assert ingest("reference").returncode == 0
    refused = ingest("early", "--against", "early")
    assert refused.returncode == 2 and "run 'early' cannot be compared against itself" in refused.stderr
    assert ingest("early").returncode == 0
    refused = ingest("late", "--against", "none such")
    assert refused.returncode == 2 and "session 's' has no run labelled 'none such'" in refused.stderr
    assert ingest("late", "--against", "early").returncode == 0
    listed = main_cli("--data-dir", str(data), "sessions")
    assert "late (8 tensors, against early)" in listed.stdout and "early (8 tensors)" in listed.stdout, listed.stdout
    (session,) = json.loads(main_cli("--data-dir", str(data), "sessions", "--json").stdout)
    labels = {r["id"]: r["label"] for r in session["runs"]}
    assert {r["label"]: labels.get(r["compared_against"]) for r in session["runs"]} == {
        "reference": None,
        "early": None,
        "late": "early",
    }
    services = open_services(Settings.from_environ(data_dir=data))
    try:
        with services.sessions() as db:
            by_label = {r.label: r for r in db.query(RunRecord)}
            assert [r.label for r in by_label.values() if r.compared_against_id == by_label["early"].id] == ["late"]
            sides = {
                (a, b)
                for a, b in db.query(PairRecord.run_a_id, PairRecord.run_b_id).filter_by(run_b_id=by_label["late"].id)
            }
            assert sides == {(by_label["early"].id, by_label["late"].id)}
    finally:
        services.close()


def test_a_run_removed_leaves_the_runs_compared_against_it_against_the_reference(tmp_path: Path) -> None:
    """The column has no foreign key: removing a run (an ingest that never completes) clears it in the runs compared
    against it, so a later run given the removed one's id is not taken for theirs."""
    services = open_services(Settings.from_environ(data_dir=tmp_path / "data"))
    try:
        ingestor = services.ingestor
        ingestor.begin("s", "reference", ["r"])
        early = ingestor.begin("s", "early", ["e"])
        late = ingestor.begin("s", "late", ["l"], against="early")
        with services.sessions() as db:
            assert db.get_one(RunRecord, late.run_id).compared_against_id == early.run_id
        ingestor.cancel(early)
        again = ingestor.begin("s", "again", ["a"])
        with services.sessions() as db:
            assert db.get(RunRecord, early.run_id) is None or again.run_id == early.run_id
            assert db.get_one(RunRecord, late.run_id).compared_against_id is None
    finally:
        services.close()


@pytest.mark.parametrize(
    "early",
    [
        ("model.safetensors", b"\x10\x00\x00\x00\x00\x00\x00\x00" + b'{"x": {"dtype"'),  # its header cut short
        ("config.json", b'{"hidden_size": 8}'),  # no tensor in it: ignored, not an unread file
    ],
    ids=["truncated", "no-tensor"],
)
def test_a_run_compared_against_a_run_that_failed_makes_the_session_incomplete_naming_it(
    shared_server: LiveServer, tmp_path: Path, early: tuple[str, bytes]
) -> None:
    """ "late" is compared against "early", whose only file is hostile (a safetensors header cut short) or holds
    no tensor, uploaded without waiting: early's ingest fails and it is kept "failed", so late has no pairs. The
    session's other candidate passes everywhere, yet the session is not "no divergence" (where early's file held no
    tensor, nothing else said so): its verdict is incomplete, naming late and why, in the API, the CLI (text and
    JSON) and the page."""
    runs = dumps(tmp_path)
    hostile = tmp_path / "hostile" / early[0]
    hostile.parent.mkdir()
    hostile.write_bytes(early[1])
    same = layered_dump(tmp_path / "same", None)  # the reference's values: every pair passes
    name = f"failed against {tmp_path.name}"
    api = f"{shared_server.url}/api"

    def ingest(label: str, path: Path, *extra: str) -> Any:
        done = main_cli(
            "ingest", "--server", shared_server.url, "--session", name, "--run", label, *extra, str(path), "--json"
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    session_id = ingest("reference", runs["reference"])["session"]["id"]
    ingest("same", same)
    accepted = upload(
        shared_server, name, [("early", hostile)], f"/api/sessions/{session_id}/runs?label=early&wait=false"
    )
    assert accepted.status_code == 202, accepted.text

    def statuses() -> dict[str, str]:
        listed = loopback_http.get(f"{api}/sessions/{session_id}", headers=shared_server.auth).json()["runs"]
        return {r["label"]: r["status"] for r in listed}

    wait_until(statuses, until=lambda s: s.get("early") == "failed", what="early's ingest to fail")
    ingest("late", runs["late"], "--against", "early")
    assert statuses() == {"reference": "ready", "same": "ready", "early": "failed", "late": "ready"}
    report = wait_done(shared_server, session_id)
    assert report["pairs"] and all(p["status"] == "pass" for p in report["pairs"])
    assert {p["b"]["run_id"] for p in report["pairs"]} != {None} and report["candidates"][0]["label"] == "same"
    assert [c["label"] for c in report["candidates"]] == ["same"]
    assert report["verdict"] == "incomplete"
    assert report["coverage"]["runs_not_compared"] == [{"run": "late", "against": "early", "why": "failed"}]
    # the CLI, on the server's data dir
    text = main_cli("--data-dir", str(shared_server.data_dir), "compare-sessions", name, name).stdout
    assert "but INCOMPLETE: " in text, text
    assert "no tensor of run 'late' (compared against 'early', which failed) was compared" in text, text
    listed = main_cli("--data-dir", str(shared_server.data_dir), "compare-sessions", name, name, "--json").stdout
    as_json = json.loads(listed)
    assert as_json["a"]["verdict"] == "incomplete"
    assert as_json["a"]["coverage"]["runs_not_compared"] == [{"run": "late", "against": "early", "why": "failed"}]
    page = loopback_http.get(f"{shared_server.url}/sessions/{session_id}", headers=shared_server.auth).text
    assert "Incomplete: no pair is outside tolerance, but not everything was compared." in page
    assert "No tensor of run &#39;late&#39; (compared against &#39;early&#39;, which failed) was compared" in page


def test_the_run_after_a_failed_first_run_is_the_reference_and_compared_against_no_other(tmp_path: Path) -> None:
    """The session's first run failed (kept "failed", as an upload whose ingest failed is): the next run is the
    session's reference (planning pairs the others against it), so it may not be compared against another run,
    whether set with PUT /api/runs/{id}/compared-against (the actions') or as it begins (`--against`); the third
    run may still be compared against it."""
    services = open_services(Settings.from_environ(data_dir=tmp_path / "data"))
    try:
        ingestor = services.ingestor
        ingestor.give_up(ingestor.begin("s", "first", ["f"]), [], keep_failure=True)
        second = ingestor.begin("s", "second", ["r"])
        third = ingestor.begin("s", "third", ["t"])
        with services.sessions() as db:
            first = db.query(RunRecord).filter_by(label="first").one()
            assert (first.status, first.position, db.get_one(RunRecord, second.run_id).position) == ("failed", 0, 1)
        with pytest.raises(InvalidInputError, match="run 'second' is the session's reference"):
            services.actions.compare_against(second.run_id, third.run_id)
        with services.sessions() as db:
            assert db.get_one(RunRecord, second.run_id).compared_against_id is None
        assert services.actions.compare_against(third.run_id, second.run_id).label == "third"
        # a run that begins after a failed first one alone is the reference too: refused where it names another
        ingestor.give_up(ingestor.begin("t", "first", ["f"]), [], keep_failure=True)
        with pytest.raises(InvalidInputError, match="run 'second' is the session's reference"):
            ingestor.begin("t", "second", ["r"], against="first")
    finally:
        services.close()


def test_capture_against_a_run_compares_it_with_that_run_checked_as_ingest_does(
    tmp_path: Path, shared_server: LiveServer
) -> None:
    """`capture(..., against=RUN)` as `ingest --against RUN`: into a data dir the run is compared against that run
    (its pairs are with it, not the reference), and a run the session lacks, the run itself or the reference's
    naming another is refused as the block opens, with the reason, nothing recorded; through a server likewise."""
    data = tmp_path / "data"
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))

    def model(shift: float) -> nn.Module:
        torch.manual_seed(0)
        linear = nn.Linear(4, 4)
        with torch.no_grad():
            linear.bias.add_(shift)
        return linear.eval()

    def run(label: str, shift: float, data_dir: Path, against: str | None = None) -> CaptureResult:
        net = model(shift)
        with torch.no_grad(), capture(net, "caught", label, data_dir=data_dir, against=against) as result:
            net(x)
        return result

    run("reference", 0.0, data_dir=data)
    early = run("early", 0.5, data_dir=data)
    late = run("late", 0.5, data_dir=data, against="early")
    with pytest.raises(InvalidInputError, match="session 'caught' has no run labelled 'none such'"):
        run("other", 0.0, data_dir=data, against="none such")
    with pytest.raises(InvalidInputError, match="run 'itself' cannot be compared against itself"):
        run("itself", 0.0, data_dir=data, against="itself")
    services = open_services(Settings.from_environ(data_dir=data))
    try:
        with services.sessions() as db:
            assert db.get_one(RunRecord, late.run_id).compared_against_id == early.run_id
            assert {r.label for r in db.query(RunRecord)} == {"reference", "early", "late"}
            sides = set(db.query(PairRecord.run_a_id).filter_by(run_b_id=late.run_id))
            assert sides == {(early.run_id,)}
    finally:
        services.close()
    # through a server: the upload's ?against=
    name = f"caught {tmp_path.name}"
    url, token = shared_server.url, shared_server.token
    same, off = model(0.0), model(0.5)
    with torch.no_grad(), capture(same, name, "reference", server=url, token=token):
        same(x)
    with torch.no_grad(), capture(off, name, "early", server=url, token=token) as sent_early:
        off(x)
    with torch.no_grad(), capture(off, name, "late", server=url, token=token, against="early") as sent_late:
        off(x)
    assert sent_late.session_id is not None
    listed = loopback_http.get(f"{shared_server.url}/api/sessions/{sent_late.session_id}", headers=shared_server.auth)
    against = {r["label"]: r["compared_against"] for r in listed.json()["runs"]}
    assert against == {"reference": None, "early": None, "late": sent_early.run_id}
