"""`find_divergence`'s session through the app as a process, in Chromium: its full runs are compared full values
against full values ("candidate (full)" against "reference (full)"), so the element-wise figures its answer gives
(max |diff|, where it is, the elements outside tolerance) are on the page and in the JSON; the module tree opens
to ops, each with its source line, the first diverging op marked; pairs judged on summaries say so."""

from __future__ import annotations

import math
from typing import Any

import torch
from playwright.sync_api import Browser, expect
from tensor_debugger import find_divergence
from tensor_debugger.compare.reports.formatting import format_where

from tests.support import loopback_http
from tests.support.browser import axe_context, axe_violations, shot
from tests.support.grouped_attention import EagerAttention
from tests.support.op_models import DIM, line_of, models
from tests.support.servers import LiveServer, wait_done


def x_input() -> torch.Tensor:
    return torch.randn(2, 5, DIM, generator=torch.Generator().manual_seed(1))


def test_find_divergences_session_shows_the_full_values_figures_on_the_page_and_in_the_json(
    shared_server: LiveServer, browser: Browser
) -> None:
    reference, candidate = models()
    found = find_divergence(
        reference.eval(), candidate.eval(), (x_input(),), session="find_divergence pages", server=shared_server.url
    )
    first = found.first
    assert first is not None and first.full is not None and not first.full.passed
    session_id = int(found.location.rsplit("/", 1)[1])
    report: dict[str, Any] = wait_done(shared_server, session_id)
    session = loopback_http.get(f"{shared_server.url}/api/sessions/{session_id}", headers=shared_server.auth).json()
    runs = {r["label"]: r for r in session["runs"]}
    # the JSON: which run each is compared against, and each pair's two runs
    assert runs["candidate (full)"]["compared_against"] == runs["reference (full)"]["id"]
    assert [runs[label]["compared_against"] for label in ("reference", "candidate", "reference (full)")] == [None] * 3
    full_pairs = [p for p in report["pairs"] if p["b"]["run_id"] == runs["candidate (full)"]["id"]]
    assert full_pairs and all(p["a"]["run_id"] == runs["reference (full)"]["id"] for p in full_pairs)
    assert all(p["summary"] is None and p["stats"] is not None for p in full_pairs)  # element by element
    candidates = {c["label"]: c for c in report["candidates"]}
    assert candidates["candidate (full)"]["against"] == "reference (full)"
    assert candidates["candidate"]["against"] == "reference"
    # the session's first divergence rests on summaries; the full runs' on full values, the figures find_divergence
    # computed in its own process
    assert report["first_divergence"]["basis"] == "summary"
    full = candidates["candidate (full)"]["first_divergence"]
    assert full["name"] == first.reference and full["basis"] is None
    assert math.isclose(full["max_abs_diff"], first.full.max_abs_diff, rel_tol=1e-9)
    assert full["argmax"] == list(first.full.argmax)
    pair = next(p for p in full_pairs if p["id"] == full["pair_id"])
    assert (pair["stats"]["mismatched"], pair["stats"]["numel"]) == (first.full.mismatched, first.full.numel)
    assert pair["where"] is not None and full["where"] == pair["where"]
    # coverage, per run against the run it is compared against: the full runs' tensors outside the two modules they
    # were asked for take nothing from what the summary candidate compared
    coverage = report["coverage"]
    n = coverage["reference_tensors"]
    assert coverage["compared"] == n and coverage["allowed_unmatched"] == [] and report["verdict"] == "diverged"
    full_count = runs["reference (full)"]["tensors"]
    assert 0 < full_count < n == runs["reference"]["tensors"]
    assert coverage["runs"] == [
        {"run": "candidate", "against": "reference", "tensors": n, "compared": n, "not_asked": 0},
        {
            "run": "reference (full)",
            "against": "reference",
            "tensors": full_count,
            "compared": full_count,
            "not_asked": n - full_count,
        },
        {
            "run": "candidate (full)",
            "against": "reference (full)",
            "tensors": full_count,
            "compared": full_count,
            "not_asked": 0,
        },
    ]

    context = axe_context(browser, {"width": 1440, "height": 900})
    try:
        page = context.new_page()
        page.goto(f"{shared_server.url}/sessions/{session_id}")
        figures = page.locator(".full-values")
        expect(figures).to_have_count(1)
        expect(figures).to_contain_text("From full values (candidate (full) compared against reference (full)")
        expect(figures).to_contain_text(f"at {list(first.full.argmax)}")
        expect(figures).to_contain_text(format_where(pair["where"]))
        expect(figures).to_contain_text(f"{first.full.mismatched} of {first.full.numel} elements outside tolerance")
        max_shown = figures.inner_text().split("max |diff| ", 1)[1].split(" ", 1)[0]
        assert math.isclose(float(max_shown), first.full.max_abs_diff, rel_tol=1e-3), max_shown
        expect(page.locator(".banner.fail .summary-basis")).to_contain_text("from summaries: ")
        expect(page.locator("#runs .compared-against")).to_have_text(
            "compared against reference (full), not the reference"
        )
        expect(page.locator("#runs .run-coverage")).to_have_text(
            [
                f"compared {n} of {n} tensors of reference",
                f"compared {full_count} of {full_count} tensors of reference, not asked to record its "
                f"{n - full_count} others (a capture of some modules only)",
                f"compared {full_count} of {full_count} tensors of reference (full)",
            ]
        )
        # the module tree: the first diverging op marked, open, with its line in both implementations
        op = page.locator('details.module[data-module="Net.layers.1.self_attn/mul#1"]')
        expect(op).to_be_visible()
        marked = op.locator("li.first-divergence")
        expect(marked).to_contain_text("first divergence")
        expect(marked).to_have_css("background-color", "rgb(253, 236, 234)")  # highlighted
        expect(page.locator(f"#pair-{report['first_divergence']['pair_id']}")).to_have_class(
            "row verdict-fail first-divergence"
        )
        expect(marked).to_contain_text("from summaries")
        for source in (line_of("reference scores"), line_of("ported scores")):
            expect(marked.locator(f'code[title="{source}"]')).to_have_text(source.rsplit("/", 1)[-1])
        # a passing module starts folded; opened, it lists its modules, then its ops, each with its line
        layer = page.locator('details.module[data-module="Net.layers.0"]')
        module = layer.locator('details.module[data-module="Net.layers.0.self_attn"]')
        inner = module.locator('details.module[data-module="Net.layers.0.self_attn/softmax#1"]')
        expect(module).not_to_be_visible()
        layer.locator(":scope > summary").click()
        expect(module).to_be_visible()
        expect(inner).not_to_be_visible()
        module.locator(":scope > summary").click()
        expect(inner).to_be_visible()
        inner.locator(":scope > summary").click()
        expect(inner.locator(".op-source")).to_contain_text(line_of("reference softmax").rsplit("/", 1)[-1])
        # a row judged on summaries says so; a full-values row shows its max |diff|
        row = page.locator(f"#pair-{report['first_divergence']['pair_id']}")
        expect(row.locator(".rests-on")).to_have_text("from summaries")
        shot(page, "find-divergence-session")
        assert axe_violations(page) == []
        # the full values' pair page: its max |diff| and where
        page.goto(f"{shared_server.url}/pairs/{full['pair_id']}")
        expect(page.locator("#where")).to_contain_text(format_where(pair["where"]))
        expect(page.locator("body")).not_to_contain_text("From summaries:")
    finally:
        context.close()


def test_ops_one_side_calls_more_often_pair_by_alignment_in_find_divergences_session_and_on_its_page(
    shared_server: LiveServer,
) -> None:
    """Eager attention against SDPA: eager's repeat_kv calls reshape and transpose more often. Those pairs were "out
    of step", not compared; now the session pairs them as find_divergence did, by the alignment of the model's ops:
    the eager output's reshape#4 with SDPA's reshape#1, compared (it passes), the eager side's own ops unmatched, in
    place. The session is incomplete for those (not diverged with no first divergence), and the page says so."""
    found = find_divergence(
        EagerAttention(False).eval(),
        EagerAttention(True).eval(),
        (x_input(),),
        session="eager against sdpa",
        server=shared_server.url,
    )
    assert found.first is None
    session_id = int(found.location.rsplit("/", 1)[1])
    report: dict[str, Any] = wait_done(shared_server, session_id)
    assert report["first_divergence"] is None and report["verdict"] == "incomplete"
    assert report["coverage"]["out_of_step"] == [] and report["progress"]["not_compared"] == 0
    pairs = {p["name"]: (p["b"]["name"], p["status"]) for p in report["pairs"]}
    assert pairs["EagerAttention/reshape#4_outputs"] == ("EagerAttention/reshape#1_outputs", "pass")
    assert "fail" not in {status for _, status in pairs.values()}
    assert "EagerAttention/reshape#2_outputs" in report["coverage"]["unmatched"]
    page = loopback_http.get(f"{shared_server.url}/sessions/{session_id}", headers=shared_server.auth).text
    assert 'data-verdict="incomplete"' in page
    assert "reference tensors have no partner in the candidate" in page
    assert "out of step" not in page
