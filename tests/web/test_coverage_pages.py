"""Coverage on the session page, in headless Chromium with scripts off: the banner is never green while reference
tensors have no partner, the first divergence names those before it, each shows as a gap marker in its place in
execution order (in the table and on the chart) with the closest candidates a hand pairing could take, and the
sessions list counts them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from playwright.sync_api import Browser, Page, expect

from tests.support.browser import ModulePage, open_new_session_form, shot, wait_until_compared
from tests.support.dumps import layered_dump, make_zip
from tests.support.servers import LiveServer

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def module_page(browser: Browser) -> Iterator[ModulePage]:
    shared = ModulePage(browser, {"width": 1280, "height": 900}, java_script_enabled=False)
    yield shared
    shared.close()


@pytest.fixture
def page(module_page: ModulePage) -> Page:
    return module_page.fresh()


def new_session(page: Page, server: LiveServer, name: str, reference: Path, candidate: Path) -> str:
    page.goto(server.url + "/")
    open_new_session_form(page)
    page.get_by_label("Name", exact=True).fill(name)
    page.get_by_label("Reference run").set_input_files(str(reference))
    page.get_by_label("Candidate run").set_input_files(str(candidate))
    page.get_by_role("button", name="Upload and ingest").click()
    page.wait_for_url("**/sessions/*")
    wait_until_compared(page)
    return page.url


def test_a_reference_tensor_without_partner_before_the_divergence(
    shared_server: LiveServer, page: Page, tmp_path: Path
) -> None:
    """The port dumped 1_attn transposed under a name of its own, and diverges from layer 2 on."""
    a = layered_dump(tmp_path / "ref", None)
    b = layered_dump(tmp_path / "cand", bug_from=2)
    tensor = torch.load(b / "1_attn.pth", weights_only=True)
    (b / "1_attn.pth").unlink()
    torch.save(tensor.t().contiguous(), b / "heads_first_attention.pth")
    name = f"coverage gap {tmp_path.name}"
    url = new_session(page, shared_server, name, make_zip(a, tmp_path / "a.zip"), make_zip(b, tmp_path / "b.zip"))
    first = page.locator(".banner.fail")
    expect(first).to_contain_text("First divergence: 2_attn")
    expect(first.locator(".unmatched-before")).to_contain_text(
        "1 reference tensor before it was not compared (no partner in the candidate): 1_attn"
    )
    expect(page.locator(".banner.culprit[data-verdict=diverged]")).to_contain_text(
        "1 of 8 reference tensors have no partner in the candidate: 1_attn"
    )
    expect(page.locator(".banner.pass")).to_have_count(0)
    gap = page.locator("tr.gap#gap-1_attn")
    expect(gap).to_have_count(1)
    expect(gap.locator(".badge")).to_have_text("unmatched")
    expect(gap).to_contain_text("Closest: heads_first_attention")
    expect(gap).to_contain_text("same element count · an alignment fits")
    # its layer's group starts open (only 1_mlp, which passes, is paired there) and counts it
    expect(page.locator("#group-Layer-1 .group-head")).to_contain_text("1 not compared")
    expect(page.locator("#group-Layer-1 tr.gap#gap-1_attn + tr.row")).to_have_attribute("data-key", "1_mlp|1_mlp")
    shot(page, "coverage-gap-marker")
    # ungrouped, in its place in execution order: after layer 0's pairs, before 1_mlp
    page.goto(url + "?group=none")
    expect(page.locator("tr.gap#gap-1_attn + tr.row")).to_have_attribute("data-key", "1_mlp|1_mlp")
    expect(page.locator("tr.row:has(+ tr.gap#gap-1_attn)")).to_have_attribute("data-key", "0_mlp|0_mlp")
    expect(page.locator("svg.static-chart line.gap")).to_have_count(1)
    expect(page.locator("svg.static-chart line.gap title")).to_have_text(
        "not compared: 1_attn (no partner in the candidate)"
    )
    page.goto(shared_server.url + f"/?q={name}")
    row = page.locator("table.sessions tr", has_text=name)
    expect(row).to_contain_text("1 unmatched")
    expect(row.locator(".badge.pass")).to_have_count(0)
    # the closest candidate's link opens the hand pairing; paired with the transpose, nothing is left out before
    page.goto(url)
    page.locator("tr.gap#gap-1_attn a", has_text="heads_first_attention").click()
    expect(page.locator("#hand-pair")).to_contain_text("Reference 1_attn")
    page.get_by_role("button", name="Pair with this alignment").click()
    wait_until_compared(page)
    expect(page.locator("tr.gap")).to_have_count(0)
    expect(page.locator(".banner.fail .unmatched-before")).to_have_count(0)
    expect(page.locator(".banner[data-verdict=diverged]")).to_have_count(1)
    expect(page.locator(".banner.culprit[data-verdict]")).to_have_count(0)


def test_a_candidate_that_dumped_only_layer_zero_never_reads_green(
    shared_server: LiveServer, page: Page, tmp_path: Path
) -> None:
    a = layered_dump(tmp_path / "ref", None)
    b = layered_dump(tmp_path / "cand", None)
    for f in b.iterdir():
        if not f.name.startswith("0_"):
            f.unlink()
    name = f"coverage layer zero {tmp_path.name}"
    new_session(page, shared_server, name, make_zip(a, tmp_path / "a.zip"), make_zip(b, tmp_path / "b.zip"))
    banner = page.locator(".banner.culprit[data-verdict=incomplete]")
    expect(banner).to_contain_text("Incomplete: no pair is outside tolerance, but not everything was compared.")
    expect(banner).to_contain_text("6 of 8 reference tensors have no partner in the candidate")
    expect(page.locator(".banner.pass")).to_have_count(0)
    expect(page.locator("tr.gap")).to_have_count(6)
    # layer 0's two pairs, then the six reference tensors of layers 1 to 3 after them, in execution order
    names = page.locator("tr.row, tr.gap").evaluate_all("rows => rows.map(r => r.dataset.key || r.dataset.name)")
    assert names == ["0_attn|0_attn", "0_mlp|0_mlp", "1_attn", "1_mlp", "2_attn", "2_mlp", "3_attn", "3_mlp"]
    expect(page.locator("tr.gap#gap-2_mlp")).to_contain_text("The candidate has no unpaired tensor to pair it with.")
    shot(page, "coverage-incomplete")
    page.goto(shared_server.url + f"/?q={name}")
    row = page.locator("table.sessions tr", has_text=name)
    expect(row).to_contain_text("6 unmatched")
    expect(row.locator(".badge.pass")).to_have_count(0)
