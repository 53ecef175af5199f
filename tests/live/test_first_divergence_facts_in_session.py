"""The session's own first divergence says the two facts `find_divergence`'s answer says of what lies before it,
in the same words, from what the session stores: ops of its module call paired by content across call indices
(two slices swapped in use: Phi's rotated and passed halves), and where the candidate's lower precision begins (a
port computing its attention scores in bfloat16 by casts of its own). A session made by two plain
`capture(level="op")` calls, reopened in a browser (the page), read through the API (the JSON) or printed as
`compare` prints it (the CLI's table and `--json`), says them; one without them says nothing of them."""

from __future__ import annotations

import html
from typing import Any

import httpx
import pytest
import torch
from tensor_debugger import capture, find_divergence
from tensor_debugger.cli.compare_output import print_table
from tensor_debugger.compare.reports.compare_report import LoweredFirst, to_json
from tensor_debugger.compare.reports.contract import compare_report
from tensor_debugger.compare.reports.divergence_words import lowered_clause
from tensor_debugger.compare.reports.pair_reports import SessionPairs
from tensor_debugger.settings import Settings
from torch import nn

from tests.live.test_unseen_answers_9 import CacheCat, D, HalfScores, HalvesSwapped, line_of
from tests.support.servers import LiveServer, session_judged
from tests.support.sessions import compared

X = torch.randn(2, 6, D, generator=torch.Generator().manual_seed(5))
# the crossed pairs find_divergence names (tests/live/test_unseen_answers_9.py), in the reference's order
CROSSED = [
    {
        "reference": "HalvesSwapped/getitem#1_outputs",
        "reference_source": line_of("rot"),
        "candidate": "HalvesSwapped/getitem#2_outputs",
        "candidate_source": line_of("port kept"),
    },
    {
        "reference": "HalvesSwapped/getitem#2_outputs",
        "reference_source": line_of("kept"),
        "candidate": "HalvesSwapped/getitem#1_outputs",
        "candidate_source": line_of("port rot"),
    },
]
LOWERED = {"name": "HalfScores/bfloat16#1_outputs", "source": line_of("half"), "dtype": "bfloat16"}


def local_session(settings: Settings, model: type[nn.Module], name: str) -> tuple[int, SessionPairs]:
    """The session of two op captures into `settings`' data dir, planned and compared."""
    session_id = 0
    for run, port in (("reference", False), ("candidate", True)):
        instance = model(port).eval()
        with torch.no_grad(), capture(instance, name, run, data_dir=settings.data_dir, level="op") as done:
            instance(X)
        assert done.session_id is not None
        session_id = done.session_id
    report = compared(settings, session_id, modules=True)
    return session_id, report


def server_session(server: LiveServer, model: type[nn.Module], name: str) -> tuple[dict[str, Any], str]:
    """The session of two op captures into `server`: its pairs JSON once judged, and its page's text (entities
    decoded)."""
    session_id = 0
    for run, port in (("reference", False), ("candidate", True)):
        instance = model(port).eval()
        with torch.no_grad(), capture(instance, name, run, server=server.url, level="op") as done:
            instance(X)
        assert done.session_id is not None
        session_id = done.session_id
    with httpx.Client(base_url=server.url, timeout=30, headers=server.auth) as client:
        report = session_judged(client, session_id)
        page = client.get(f"/sessions/{session_id}")
        assert page.status_code == 200, page.text
    return report, html.unescape(page.text)


def cli_output(session_id: int, name: str, report: SessionPairs, capsys: pytest.CaptureFixture[str]) -> tuple[str, Any]:
    """What `compare` prints of the session (its table) and its `--json` report."""
    contract = compare_report(session_id, name, "http://127.0.0.1/", report, [])
    capsys.readouterr()
    print_table(contract)
    return capsys.readouterr().out, to_json(contract)


def test_slices_swapped_in_use_are_named_by_the_sessions_first_divergence(
    settings: Settings, shared_server: LiveServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two captures of the hand attention whose port swaps the rotated halves: the session's first divergence (in
    the API's JSON, `compare --json`, the CLI's table and the page) names both crossed pairs of slices with both
    sides' lines, in the sentence find_divergence's answer says."""
    found = find_divergence(
        HalvesSwapped(False).eval(), HalvesSwapped(True).eval(), X, session="halves answer", data_dir=settings.data_dir
    )
    session_id, report = local_session(settings, HalvesSwapped, "halves")
    first = report.first_divergence
    assert first is not None and first.name == "HalvesSwapped/mul#2_outputs", first
    words = first.crossed_words
    assert words.startswith("Before it in its module call, ops paired by content across call indices: "), words
    assert f" {words} " in repr(found), (words, repr(found))  # the same sentence, the same pairs and lines
    assert first.lowered_first is None and first.lowered_words == ""
    printed, contract = cli_output(session_id, "halves", report, capsys)
    assert contract["first_divergence"]["crossed_before"] == CROSSED, contract["first_divergence"]
    assert contract["first_divergence"]["lowered_first"] is None
    assert f"\n{words}\n" in printed, printed

    api, page = server_session(shared_server, HalvesSwapped, "halves in a server")
    assert api["first_divergence"]["name"] == "HalvesSwapped/mul#2_outputs", api["first_divergence"]
    assert api["first_divergence"]["crossed_before"] == CROSSED, api["first_divergence"]
    assert api["first_divergence"]["lowered_first"] is None
    assert f'<span class="crossed-before" id="crossed-before">{words}</span>' in page
    assert 'id="lowered-first"' not in page


def test_a_port_computing_its_scores_in_bfloat16_is_told_where_that_begins_by_the_session(
    settings: Settings, shared_server: LiveServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two captures of the port computing its scores in bfloat16: without a precision floor the rounding is a
    divergence (the scores' matmul), and the session's first divergence says where the candidate's lower precision
    begins, in the clause find_divergence's answer says it with (its floor: no divergence)."""
    found = find_divergence(
        HalfScores(False).eval(), HalfScores(True).eval(), X, session="half answer", data_dir=settings.data_dir
    )
    assert found.lowered_first == (LOWERED["name"], LOWERED["source"]), repr(found)
    clause = lowered_clause(LoweredFirst(**LOWERED))
    assert clause in repr(found), repr(found)
    session_id, report = local_session(settings, HalfScores, "half")
    first = report.first_divergence
    assert first is not None and first.name == "HalfScores/matmul#1_outputs", first
    assert first.lowered_first == LoweredFirst(**LOWERED), first
    assert first.lowered_words == f"Where the candidate's lower precision begins: {clause}."
    assert first.crossed_before == [] and first.crossed_words == ""
    printed, contract = cli_output(session_id, "half", report, capsys)
    assert contract["first_divergence"]["lowered_first"] == LOWERED, contract["first_divergence"]
    assert contract["first_divergence"]["crossed_before"] == []
    assert f"\n{first.lowered_words}\n" in printed, printed

    api, page = server_session(shared_server, HalfScores, "half in a server")
    assert api["first_divergence"]["lowered_first"] == LOWERED, api["first_divergence"]
    assert api["first_divergence"]["crossed_before"] == []
    assert f'<span class="lowered-first" id="lowered-first">{first.lowered_words}</span>' in page
    assert 'id="crossed-before"' not in page


def test_a_session_without_them_says_nothing_of_them(settings: Settings) -> None:
    """A port scaling its keys (no slices crossed, every tensor float32): neither fact, in the report or words."""
    _, report = local_session(settings, CacheCat, "cache")
    first = report.first_divergence
    assert first is not None and first.name == "CacheCat/cat#1_outputs", first
    assert (first.crossed_before, first.lowered_first) == ([], None)
    assert (first.crossed_words, first.lowered_words) == ("", "")
