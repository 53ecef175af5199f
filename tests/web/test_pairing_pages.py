"""Pairing from the pages, in headless Chromium with scripts off (the forms work before any script runs): the
rules form with its errors in place, the pairing file downloaded and uploaded, grouping by similarity band and
sorting by size, pairing by hand with a transpose, and exploring one run from the sessions page."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from playwright.sync_api import Browser, Page, expect

from tests.support import loopback_http
from tests.support.browser import ModulePage, open_new_session_form, shot, wait_until_compared
from tests.support.dumps import make_zip, seeded
from tests.support.servers import LiveServer, wait_done

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def module_page(browser: Browser) -> Iterator[ModulePage]:
    shared = ModulePage(browser, {"width": 1280, "height": 900}, java_script_enabled=False)
    yield shared
    shared.close()


@pytest.fixture
def page(module_page: ModulePage) -> Page:
    return module_page.fresh()


def two_runs(tmp_path: Path) -> tuple[Path, Path]:
    """Two runs: a transposed weight, a renamed tensor, an identical one, a slightly different one."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    weight = seeded((32, 64), 1)
    torch.save(weight, a / "proj_weight.pth")
    torch.save(weight.t().contiguous(), b / "weight_t.pth")
    torch.save(seeded((8, 8), 2), a / "L0_attention_out.pth")
    torch.save(seeded((8, 8), 2), b / "L0_attn_out.pth")
    torch.save(seeded((4, 4), 3), a / "L0_mlp.pth")
    torch.save(seeded((4, 4), 3) + 1e-7, b / "L0_mlp.pth")
    torch.save(seeded((16, 16), 4), a / "L1_mlp.pth")
    torch.save(seeded((16, 16), 4) + 1.0, b / "L1_mlp.pth")
    return make_zip(a, tmp_path / "a.zip"), make_zip(b, tmp_path / "b.zip")


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


def test_rules_form_and_pairing_file(shared_server: LiveServer, page: Page, tmp_path: Path) -> None:
    url = new_session(page, shared_server, "rules page", *two_runs(tmp_path))
    session_id = int(url.rstrip("/").rsplit("/", 1)[1])
    form = page.locator("form.pairing-rules")
    assert form.get_by_label("Strategies").input_value() == ""  # the default chain
    # a bad pattern: said next to the form, as typed, with a 400 and nothing changed
    form.get_by_label("Name pattern").fill(r"L(?P<layer>\d+)")
    with page.expect_response(lambda r: r.url.endswith("/pairing-rules")) as answer:
        form.get_by_role("button", name="Apply and pair again").click()
    assert answer.value.status == 400
    alert = page.locator("section.pairing").get_by_role("alert")
    assert "has no named group 'stage'" in alert.inner_text()
    assert page.locator("form.pairing-rules").get_by_label("Name pattern").input_value() == r"L(?P<layer>\d+)"
    form = page.locator("form.pairing-rules")
    form.get_by_label("Strategies").fill("name, fuzy")
    form.get_by_role("button", name="Apply and pair again").click()
    assert "unknown pairing strategy 'fuzy'" in page.locator("section.pairing").get_by_role("alert").inner_text()
    assert loopback_http.get(f"{shared_server.url}/api/sessions/{session_id}").json()["name_pattern"] is None
    # a fuzzy threshold without fuzzy in the chain
    form = page.locator("form.pairing-rules")
    form.get_by_label("Strategies").fill("name")
    form.get_by_label("Name pattern").fill("")
    form.get_by_label("Fuzzy threshold").fill("0.9")
    form.get_by_role("button", name="Apply and pair again").click()
    assert "needs fuzzy in the chain" in page.locator("section.pairing").get_by_role("alert").inner_text()
    # good rules pair the session again
    form = page.locator("form.pairing-rules")
    form.get_by_label("Strategies").fill("name, fuzzy")
    form.get_by_label("Fuzzy threshold").fill("0.99")
    form.get_by_role("button", name="Apply and pair again").click()
    wait_until_compared(page)
    assert page.locator("section.pairing").get_by_role("alert").count() == 0
    assert page.locator("form.pairing-rules").get_by_label("Strategies").input_value() == "name, fuzzy"
    assert page.locator("form.pairing-rules").get_by_label("Fuzzy threshold").input_value() == "0.99"
    shown = loopback_http.get(f"{shared_server.url}/api/sessions/{session_id}").json()
    assert shown["strategies"] == ["name", "fuzzy:0.99"]
    unmatched = page.locator("ul.unmatched").inner_text()
    assert "L0_attention_out" in unmatched and "L0_attn_out" in unmatched  # 0.95 is under 0.99 now
    # the pairing file as a download
    with page.expect_download() as download:
        page.get_by_role("link", name="Download pairing file").click()
    assert download.value.suggested_filename == f"session-{session_id}-pairing.json"
    exported = json.loads(Path(download.value.path()).read_text())
    assert exported["strategies"] == ["name", "fuzzy:0.99"]
    # uploaded: its pairs become manual pairs
    exported["pairs"].append({"a": "L0_attention_out", "b": "L0_attn_out"})
    good = tmp_path / "pairing.json"
    good.write_text(json.dumps(exported))
    page.get_by_label("Pairing file").set_input_files(str(good))
    page.get_by_role("button", name="Upload pairing file").click()
    wait_until_compared(page)
    pairs = wait_done(shared_server, session_id)["pairs"]
    assert ("L0_attention_out", "L0_attn_out", "manual") in {
        (p["a"]["name"], p["b"]["name"], p["strategy"]) for p in pairs
    }
    # a file that is not one: said next to the upload form
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"pears": []}))
    page.get_by_label("Pairing file").set_input_files(str(bad))
    with page.expect_response(lambda r: r.url.endswith("/pairing")) as answer:
        page.get_by_role("button", name="Upload pairing file").click()
    assert answer.value.status == 400
    assert "no key 'pears'" in page.locator("section.pairing").get_by_role("alert").inner_text()
    notjson = tmp_path / "notes.txt"
    notjson.write_text("hello")
    page.get_by_label("Pairing file").set_input_files(str(notjson))
    page.get_by_role("button", name="Upload pairing file").click()
    assert "notes.txt is not JSON" in page.locator("section.pairing").get_by_role("alert").inner_text()
    shot(page, "pairing-file-error")


def test_bands_size_and_a_transpose_by_hand(shared_server: LiveServer, page: Page, tmp_path: Path) -> None:
    url = new_session(page, shared_server, "bands page", *two_runs(tmp_path))
    page.get_by_label("Group by").select_option("band")
    page.get_by_label("Sort by").select_option("numel")
    page.get_by_role("button", name="Apply", exact=True).click()
    assert "group=band" in page.url and "sort=numel" in page.url
    expect(page.locator("tr.group-head a.toggle")).to_have_text(["Identical", "Within tolerance", "Failing"])
    # passing groups start collapsed; without scripts, a group's header is a link to the page with it open
    page.get_by_role("link", name="Identical", exact=True).click()
    identical = page.locator("tbody.group", has_text="Identical").locator("tr.row")
    expect(identical.filter(has_text="L0_attention_out")).not_to_have_count(0)  # once the opened page is there
    page.get_by_role("link", name="Within tolerance", exact=True).click()
    assert "L0_mlp" in page.locator("tbody.group", has_text="Within tolerance").locator("tr.row").inner_text()
    assert "L1_mlp" in page.locator("tbody.group", has_text="Failing").inner_text()
    page.get_by_label("Group by").select_option("none")
    page.get_by_role("button", name="Apply", exact=True).click()
    page.wait_for_url("**group=none**")
    expect(page.locator("tr.group-head")).to_have_count(0)  # the ungrouped page, loaded
    names = [row.split("\t")[1] for row in page.locator("table.pairs tr.row").all_inner_texts()]
    assert names[0].startswith("L1_mlp") and names[-1].startswith("L0_mlp")  # 256, 64, 16 elements
    # [32, 64] against [64, 32]: paired as a transpose, not flattened
    page.goto(url)
    hand = page.locator("form.pair-by-hand")
    hand.get_by_label("Reference tensor").select_option("proj_weight")
    hand.get_by_label("Candidate tensor").select_option("weight_t")
    hand.get_by_role("button", name="Pair by hand").click()
    choice = page.locator("form.alignment-choice")
    assert "[32, 64]" in page.locator("section.hand-pair").inner_text()
    assert "flattened" not in choice.inner_text()
    shot(page, "hand-pair-choices")
    choice.get_by_label("candidate dims permuted [1, 0] -> [32, 64]").check()
    choice.get_by_role("button", name="Pair with this alignment").click()
    wait_until_compared(page)
    row = page.locator("table.pairs tr", has_text="proj_weight")
    assert "pass" in row.locator(".verdict").inner_text().lower()
    assert "permuted [1, 0]" in row.locator(".alignment").inner_text()


def test_explore_one_run_from_the_sessions_page(shared_server: LiveServer, page: Page, tmp_path: Path) -> None:
    torch.save({"q": seeded((4, 8), 1), "k": seeded((4, 8), 1), "v": seeded((8, 4), 2)}, tmp_path / "acts.pth")
    torch.save({f"t{i}": torch.full((2,), float(i)) for i in range(101)}, tmp_path / "many.pth")
    page.goto(shared_server.url + "/")
    explore = page.locator("form.explore-run")
    explore.get_by_label("Run to explore").set_input_files(str(tmp_path / "many.pth"))
    with page.expect_response(lambda r: r.url.endswith("/sessions/explore")) as answer:
        explore.get_by_role("button", name="Upload and explore").click()
    assert answer.value.status == 400
    alert = page.locator("section.explore").get_by_role("alert")
    assert "101 tensors make 5,050 pairs, over 5,000: choose fewer with a name filter" in alert.inner_text()
    explore = page.locator("form.explore-run")
    explore.get_by_label("Run to explore").set_input_files(str(tmp_path / "many.pth"))
    explore.get_by_label("Only names matching").fill("*T1?")
    explore.get_by_role("button", name="Upload and explore").click()
    page.wait_for_url("**/sessions/*")
    wait_until_compared(page)
    expect(page.get_by_role("heading", name="explore many.pth")).to_be_visible()
    assert page.locator("table.pairs tr.row").count() == 45  # one group: open
    page.goto(shared_server.url + "/")
    explore = page.locator("form.explore-run")
    explore.get_by_label("Session name").fill("my exploration")
    explore.get_by_label("Run to explore").set_input_files(str(tmp_path / "acts.pth"))
    explore.get_by_role("button", name="Upload and explore").click()
    page.wait_for_url("**/sessions/*")
    wait_until_compared(page)
    assert page.locator("table.pairs tr.row").count() == 3
    row = page.locator("table.pairs tr", has_text="acts.k")
    assert "pass" in row.first.locator(".verdict").inner_text().lower()
