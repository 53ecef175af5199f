"""`find_divergence`'s precision floor is stored in its session as the session's rerun (role "noise": "noise", the
floor's summaries; "noise (full)", its full values, compared against "reference (full)"), and the session judges
every pair by the noise rule as the answer does: the notebook's answer, the session's JSON, its page and the sessions
list agree on a bfloat16 port with no bug (no divergence, no culprit) and with a bug in layer 2 (layer 2,
everywhere). Before, the floor was not stored and the session, judging by tolerances alone, named layer 0 where the
answer named nothing."""

from __future__ import annotations

import html
import re
from typing import Any

import httpx
import pytest
import torch
from tensor_debugger import find_divergence
from tensor_debugger.demo.models import ResidualStack

from tests.live.test_precision_floor import MODELS, _inputs
from tests.support.servers import LiveServer, session_judged


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("bug", [False, True], ids=["no bug", "bug in layer 2"])
def test_the_answer_the_json_and_the_page_agree_on_a_bfloat16_port(
    shared_server: LiveServer, model: str, bug: bool
) -> None:
    make, shape = MODELS[model]
    found = find_divergence(
        make().eval(),
        make(bug=bug).to(torch.bfloat16).eval(),
        (_inputs(shape),),
        session=f"floor in session {model} {bug}",
        server=shared_server.url,
    )
    root = make.__name__
    session_id = int(found.location.rpartition("/sessions/")[2])
    with httpx.Client(base_url=shared_server.url, timeout=30) as client:
        report = session_judged(client, session_id)
        runs = {r["label"]: r["role"] for r in client.get(f"/api/sessions/{session_id}").json()["runs"]}
        page = client.get(f"/sessions/{session_id}").text
        graph = client.get(f"/sessions/{session_id}/graph").text
        listed = client.get("/", params={"q": f"floor in session {model} {bug}"}).text
    banner = re.search(r'<p class="banner (?:fail|pass)"[^>]*data-verdict="(\w+)"[^>]*>(.*?)</p>', page, re.S)
    assert banner is not None
    row = re.search(rf'<a href="/sessions/{session_id}">.*?</tr>', listed, re.S)
    assert row is not None
    # the row from its name's link on: its runs, then (after two cells with a class) its "First divergence"
    first_cell = re.findall(r"<td>(.*?)</td>", row.group(0), re.S)[1]
    assert runs["noise"] == "noise"
    assert any(p["rule"] == "noise" for p in report["pairs"])
    if not bug:
        assert found.first is None and found.culprits == [], found.words()
        assert report["verdict"] == "no_divergence" and report["first_divergence"] is None
        assert banner.group(1) == "no_divergence"
        assert first_cell == "—", first_cell  # the list judges as the page (its rows: by tolerances alone)
        assert 'id="judged-by-noise"' in banner.group(2)  # not "every pair is within tolerance" alone
        # hashes differ (rounding), so a second pass compared full values, judged by the floor too: nothing beyond it
        assert runs["noise (full)"] == "noise" and found.full_compared > 0, found.words()
        # the session judges culprits on the second pass's full values, as the answer does: none
        assert report["modules"]["culprits"] == [] and report["modules"]["culprit"] is None
        note = report["modules"]["values_note"]
        assert "run 'candidate (full)' against 'reference (full)', with the rerun 'noise (full)'" in note, note
        assert 'id="culprits-judged-on"' in page
        assert not re.search(r'<div class="[^"]*on-path[^"]*\bculprit\b[^"]*"', graph)
        return
    assert found.first is not None and found.first.module.startswith(f"{root}.layers.2"), found.words()
    assert found.culprits and all(c.startswith(f"{root}.layers.2") for c in found.culprits), found.words()
    assert runs["noise (full)"] == "noise"
    assert report["verdict"] == "diverged"
    assert report["first_divergence"]["name"] == found.first.reference
    by_label = {c["label"]: c for c in report["candidates"]}
    full = by_label["candidate (full)"]["first_divergence"]
    assert full is not None and f"{root}.layers.2" in full["name"], full  # its full values judged by the floor's
    assert banner.group(1) == "diverged"
    assert f">{found.first.reference}</a>" in banner.group(2)
    assert f">{found.first.reference}</a>" in first_cell
    # the culprit the answer names from the second pass's full values is the session's: judged by the module view's
    # rule on the "(full)" runs' pairs, with the rerun "noise (full)"
    modules = report["modules"]
    assert [c["module_path"] for c in modules["culprits"]] == found.culprits, (modules, found.words())
    assert modules["culprit"]["module_path"] == found.culprits[0]
    assert "'candidate (full)' against 'reference (full)', with the rerun 'noise (full)'" in modules["values_note"]
    # only modules recorded with full values are ranked: layer 0 was compared on summaries alone
    assert {c["module_path"] for c in modules["ranked"]} <= {m for m in _full_modules(report) if m}
    assert not any(c["module_path"].startswith(f"{root}.layers.0") for c in modules["ranked"])
    culprit = re.search(r'<p class="banner culprit" role="alert" id="culprit">(.*?)</p>', page, re.S)
    assert culprit is not None and f"<code>{found.culprits[0]}</code>" in culprit.group(1)
    assert re.search(rf'<details class="module [^"]* culprit" data-module="{re.escape(found.culprits[0])}"', page)
    # the model graph highlights the path to it as to a culprit
    assert re.search(r'<div class="[^"]*on-path[^"]*\bculprit\b[^"]*"', graph)


def _full_modules(report: dict[str, Any]) -> set[str]:
    """The modules of the pairs of run "candidate (full)"."""
    full = {c["run_id"] for c in report["candidates"] if c["label"] == "candidate (full)"}
    return {p["module_path"] for p in report["pairs"] if p["b"]["run_id"] in full}


def test_a_culprit_named_by_its_own_error_is_the_sessions_too(shared_server: LiveServer) -> None:
    """12 residual blocks of width 32 in bfloat16, SiLU in the last: its output is within the precision floor, and
    find_divergence names it from its own error, replaying its call on the reference's arguments (runs
    "reference (own)", "candidate (own)", "noise (own)"); the session's module view judges those runs by its own
    rule and names the same culprit, on the JSON and the page (before: none, on either)."""
    x = torch.randn(1, 16, 32, generator=torch.Generator().manual_seed(1))
    found = find_divergence(
        ResidualStack(hidden=32).eval(),
        ResidualStack(hidden=32, bug=True).to(torch.bfloat16).eval(),
        (x,),
        session="own error in session",
        server=shared_server.url,
    )
    assert found.culprits == ["ResidualStack.layers.11"], found.words()
    assert "ResidualStack.layers.11_outputs" in found.floored_outputs  # the case: its output is within the floor
    session_id = int(found.location.rpartition("/sessions/")[2])
    with httpx.Client(base_url=shared_server.url, timeout=30) as client:
        report = session_judged(client, session_id)
        runs = {r["label"]: r["role"] for r in client.get(f"/api/sessions/{session_id}").json()["runs"]}
        page = client.get(f"/sessions/{session_id}").text
    assert runs["noise (own)"] == "noise" and "candidate (own)" in runs and "reference (own)" in runs
    modules = report["modules"]
    assert [c["module_path"] for c in modules["culprits"]] == found.culprits, modules
    assert modules["culprit"]["module_path"] == "ResidualStack.layers.11"
    assert "named ResidualStack.layers.11 on run 'candidate (own)' against 'reference (own)'" in modules["values_note"]
    assert not any(n.startswith("ResidualStack.layers.11 adds ") for n in modules["noise_notes"]), modules
    culprit = re.search(r'<p class="banner culprit" role="alert" id="culprit">(.*?)</p>', page, re.S)
    assert culprit is not None and "<code>ResidualStack.layers.11</code>" in culprit.group(1)
    # the page says which runs named it: the replay's
    assert "named ResidualStack.layers.11 on run 'candidate (own)' against 'reference (own)'" in html.unescape(page)
