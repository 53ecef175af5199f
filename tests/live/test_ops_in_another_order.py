"""A port that computes ops of one name and shape in another order inside one module call (k before q: two
`linear`s of one shape swapped). The alignment of a module call's ops goes by name and shape, so it pairs them by
position, q against k: a false divergence. Their contents (the summaries every captured or stored tensor keeps)
settle it (engine/op_alignment.settle_by_content): where they match under another one-to-one pairing the ops pair by
content and say so; where content decides nothing, position stays and the pair says it is ambiguous, and its
error counts toward no culprit (its module is judged on its own inputs and outputs); a real bug among the swapped
ops stays a divergence."""

from __future__ import annotations

from typing import Any

import httpx
import msgspec
import pytest
import torch
from tensor_debugger import capture, find_divergence
from tensor_debugger.cli.compare_output import print_table
from tensor_debugger.compare.planning.op_pairs import (
    ALIGNED,
    AMBIGUOUS_STRATEGY,
    BY_CONTENT_STRATEGY,
    LEFT_OVER_STRATEGY,
)
from tensor_debugger.compare.reports.contract import compare_report
from tensor_debugger.compare.reports.pair_reports import SessionPairs
from tensor_debugger.settings import Settings

from tests.support.polling import wait_until
from tests.support.reordered_attention import ATTN, Net, x_input
from tests.support.servers import LiveServer
from tests.support.sessions import compared


def session_of(settings: Settings, name: str, order: str, bug: str, values: str) -> tuple[int, SessionPairs]:
    """The session of an op capture of the reference and of a port computing q, k, v in `order` (`bug`: those it
    gets wrong), planned and compared."""
    x = x_input()
    for model, run in ((Net(), "reference"), (Net(order, bug), "candidate")):
        with (
            torch.no_grad(),
            capture(model.eval(), name, run, data_dir=settings.data_dir, level="op", values=values) as done,
        ):
            model(x)
    assert done.session_id is not None
    report = compared(settings, done.session_id, modules=True)
    return done.session_id, report


def notes_of(session_id: int, report: SessionPairs) -> dict[str, str]:
    """`compare --json`'s pairs' `pairing_note`s, by the reference's op (where a pair has one)."""
    cli: dict[str, Any] = msgspec.json.decode(
        msgspec.json.encode(compare_report(session_id, "ops", "http://127.0.0.1/", report, []))
    )
    return {
        p["name"].removeprefix(ATTN + "/").removesuffix("_outputs"): p["pairing_note"]
        for p in cli["pairs"]
        if p["pairing_note"]
    }


def pairs_of(report: SessionPairs) -> dict[str, tuple[str, str, str]]:
    """Each attention op's pair: the reference's op -> (the candidate's, strategy, status)."""
    return {
        p.name.removeprefix(ATTN + "/").removesuffix("_outputs"): (
            p.b.name.removeprefix(ATTN + "/").removesuffix("_outputs"),
            str(p.strategy),
            str(p.status),
        )
        for p in report.pairs
        if p.name.startswith(ATTN + "/")
    }


@pytest.mark.parametrize("values", ["summary", "full"])
def test_q_and_k_computed_in_another_order_pair_by_content_and_say_so(settings: Settings, values: str) -> None:
    """The port computes k, q, v; the reference q, k, v. By position its k (the weight's mul, linear, view,
    transpose) faced the reference's q, and the first divergence was the first of them. By content, q faces q and k
    faces k: every pair passes, and those pairs say they were paired by content, in the JSON too."""
    session_id, report = session_of(settings, f"kqv {values}", "kqv", "", values)
    pairs = pairs_of(report)
    for op in ("linear", "view", "transpose"):
        assert pairs[f"{op}#1"] == (f"{op}#2", BY_CONTENT_STRATEGY, "pass"), pairs[f"{op}#1"]
        assert pairs[f"{op}#2"] == (f"{op}#1", BY_CONTENT_STRATEGY, "pass"), pairs[f"{op}#2"]
        assert pairs[f"{op}#3"] == (f"{op}#3", ALIGNED, "pass")  # v: in place, its content confirms it
    assert pairs["linear#4"] == ("linear#4", ALIGNED, "pass")  # the output projection, of that shape too
    assert report.first_divergence is None and str(report.verdict) == "no_divergence"
    assert [p.name for p in report.pairs if p.status != "pass"] == []
    noted = notes_of(session_id, report)
    assert set(noted) == {f"{op}#{n}" for op in ("linear", "view", "transpose") for n in (1, 2)}
    assert all(n.startswith("paired by content: the two sides compute these ops") for n in noted.values()), noted


def test_a_bug_among_ops_computed_in_another_order_stays_a_bug(settings: Settings) -> None:
    """The port computes k, q, v and gets k wrong (its weight scaled): q pairs with q by content and passes; k, the
    one left, pairs with k and fails: the first divergence, with the attention its culprit, as where the port runs
    them in the reference's order."""
    session_id, report = session_of(settings, "kqv, k wrong", "kqv", "k", "full")
    pairs = pairs_of(report)
    for op in ("linear", "view", "transpose"):
        assert pairs[f"{op}#1"] == (f"{op}#2", BY_CONTENT_STRATEGY, "pass"), pairs[f"{op}#1"]
        assert pairs[f"{op}#2"] == (f"{op}#1", LEFT_OVER_STRATEGY, "fail"), pairs[f"{op}#2"]
    first = report.first_divergence
    assert first is not None and first.name == f"{ATTN}/linear#2_outputs", first
    assert str(report.verdict) == "diverged"
    assert report.modules is not None and report.modules.culprit is not None
    assert report.modules.culprit.module_path == ATTN
    assert notes_of(session_id, report)["linear#2"].startswith("paired by content: ")
    # in the reference's order, the same bug: the same first divergence and culprit, every pair by position
    _, same_order = session_of(settings, "qkv, k wrong", "qkv", "k", "full")
    assert {v[1] for v in pairs_of(same_order).values()} == {ALIGNED}
    assert same_order.first_divergence is not None and same_order.first_divergence.name == first.name
    assert same_order.modules is not None and same_order.modules.culprit is not None
    assert same_order.modules.culprit.module_path == ATTN


def test_where_content_decides_nothing_position_stays_ambiguous_and_the_module_is_judged_on_its_own(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    """The port computes k, q, v and gets both q and k wrong: no content matches another op's, and by position
    each faces the other's (q against k): the pairs stay by position, failing, marked ambiguous, in the JSON and
    as the first divergence's; their errors count toward no culprit, but the attention, whose inputs agree and
    whose output differs, is the culprit whichever op faces which inside it. In the reference's order, the same
    bugs: each op is its partner's nearest by content, so position stands, and the attention is the culprit too."""
    session_id, report = session_of(settings, "kqv, q and k wrong", "kqv", "qk", "full")
    pairs = pairs_of(report)
    for op in ("linear", "view", "transpose"):
        for n in (1, 2):
            assert pairs[f"{op}#{n}"] == (f"{op}#{n}", AMBIGUOUS_STRATEGY, "fail"), pairs[f"{op}#{n}"]
        assert pairs[f"{op}#3"] == (f"{op}#3", ALIGNED, "pass")
    assert pairs["linear#4"] == ("linear#4", ALIGNED, "fail")  # the output projection: its own nearest
    first = report.first_divergence
    assert first is not None and first.name == f"{ATTN}/linear#1_outputs" and str(report.verdict) == "diverged"
    assert report.modules is not None and report.modules.culprit is not None
    assert report.modules.culprit.module_path == ATTN, report.modules.culprits
    note = notes_of(session_id, report)["linear#1"]
    assert note.startswith("paired by position, ambiguous: ") and "counts toward no culprit" in note, note
    print_table(compare_report(session_id, "ops", "http://127.0.0.1/", report, []))
    printed = capsys.readouterr().out
    assert f"FIRST DIVERGENCE: {ATTN}/linear#1_outputs" in printed, printed
    assert "  its two ops were paired by position, ambiguous: " in printed, printed
    _, same_order = session_of(settings, "qkv, q and k wrong", "qkv", "qk", "full")
    assert {v[1] for v in pairs_of(same_order).values()} == {ALIGNED}
    assert same_order.modules is not None and same_order.modules.culprit is not None
    assert same_order.modules.culprit.module_path == ATTN


def test_find_divergence_pairs_ops_computed_in_another_order_by_content(settings: Settings) -> None:
    """find_divergence pairs the summaries as the session does: k before q finds no divergence; with k wrong, the
    first divergence is k's projection (the reference's linear#2, the port's linear#1), paired by content, and the
    paragraph says so."""
    x = x_input()
    found = find_divergence(Net().eval(), Net("kqv").eval(), (x,), session="order", data_dir=settings.data_dir)
    assert found.first is None and found.culprits == [], repr(found)
    found = find_divergence(Net().eval(), Net("kqv", "k").eval(), (x,), session="order k", data_dir=settings.data_dir)
    first = found.first
    assert first is not None and first.reference == f"{ATTN}/linear#2_outputs", repr(found)
    assert first.candidate == f"{ATTN}/linear#1_outputs"
    assert first.pairing is not None and first.pairing.startswith("paired by content: ")
    assert "Its two ops were paired by content: " in repr(found)
    assert found.culprits == [ATTN], found.culprits


def test_the_api_and_the_pair_page_say_how_ops_in_another_order_were_paired(shared_server: LiveServer) -> None:
    """Captured into a server: the session's pairs JSON gives each such pair its strategy and `pairing_note`, and
    the pair page shows the note."""
    x = x_input()
    for model, run in ((Net(), "reference"), (Net("kqv"), "candidate")):
        with (
            torch.no_grad(),
            capture(model.eval(), "ops in another order", run, server=shared_server.url, level="op") as result,
        ):
            model(x)
    assert result.session_id is not None
    with httpx.Client(base_url=shared_server.url, timeout=30, headers=shared_server.auth) as client:
        report: dict[str, Any] = wait_until(
            lambda: client.get(f"/api/sessions/{result.session_id}/pairs").json(),
            until=lambda r: r["pairs"] and not r["progress"]["pending"],
            what="the captured session's pairs to be computed",
            timeout=120,
            interval=0.05,
        )
        assert report["verdict"] == "no_divergence", report["verdict"]
        pair = next(p for p in report["pairs"] if p["name"] == f"{ATTN}/linear#1_outputs")
        assert (pair["b"]["name"], pair["strategy"]) == (f"{ATTN}/linear#2_outputs", BY_CONTENT_STRATEGY)
        assert pair["pairing_note"].startswith("paired by content: ")
        page = client.get(f"/pairs/{pair['id']}").text
        assert '<p class="meta" id="pairing-note">paired by content: the two sides compute these ops' in page
