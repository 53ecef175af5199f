"""The session and pair pages on sessions of real sizes, in headless Chromium: the demo, a 24-layer model whose
divergence is inside one attention head, and a session of 2,016 pairs (64 tensors explored against each other).
One server holds all three for the module; each test saves screenshots in test-artifacts/."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import torch
from playwright.sync_api import Browser, Page
from tensor_debugger.demo.synthetic import DumpShape, Plant, write_dump

from tests.support.browser import shot
from tests.support.dumps import make_zip, seeded
from tests.support.servers import LiveServer, started_server, upload, wait_done

pytestmark = pytest.mark.browser

HEADS = DumpShape(tokens=16, heads=8, head_dim=8)
PLANT = Plant(9, "value", (0, 5, 11, 2), 0.5)  # layer 9's values, head 5, token 11


@dataclass(frozen=True)
class Sessions:
    server: LiveServer
    demo: int
    heads: int  # 24 layers, the divergence in one head
    big: int  # 2,016 pairs


@pytest.fixture(scope="module")
def sessions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sessions]:
    root = tmp_path_factory.mktemp("page-views")
    server = started_server(root, demo=True)
    try:
        write_dump(root / "ref", 24, seed=3, shape=HEADS)
        write_dump(root / "cand", 24, seed=3, shape=HEADS, plant=PLANT)
        files = [
            ("reference", make_zip(root / "ref", root / "ref.zip")),
            ("candidate", make_zip(root / "cand", root / "cand.zip")),
        ]
        heads = upload(server, "24 layers", files).json()["session"]["id"]
        # 64 tensors, each paired with every other: the same values everywhere but in layer 0's
        tensors = {f"layers.{k}.out": seeded((8, 16), 1) for k in range(64)}
        tensors["layers.0.out"] = tensors["layers.0.out"] + 0.25
        torch.save(tensors, root / "acts.pth")
        big = upload(server, "", [("run", root / "acts.pth")], url="/api/sessions?explore=true").json()["session"]["id"]
        for session_id in (1, heads, big):
            wait_done(server, session_id)
        yield Sessions(server, 1, heads, big)
    finally:
        server.stop()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    opened = context.new_page()
    yield opened
    context.close()


def elements(page: Page) -> int:
    return int(page.evaluate("document.getElementsByTagName('*').length"))


def test_a_big_session_loads_a_small_page_with_groups_collapsed(sessions: Sessions, page: Page) -> None:
    url = f"{sessions.server.url}/sessions/{sessions.big}"
    page.goto(url)
    heads = page.locator("tr.group-head")
    assert heads.count() == 63  # layers 0 to 62 hold the pairs' reference sides
    assert sum(int(t.split()[0]) for t in page.locator("tr.group-head .count").all_inner_texts()) == 2016
    assert elements(page) < 15_000, elements(page)
    # only layer 0's group fails, and holds the first divergence: it alone is open
    opened = page.locator("tbody.group.open")
    assert opened.count() == 1 and opened.get_attribute("data-key") == "Layer 0"
    assert page.locator("tr.row").count() == 63
    first = page.locator("tr.first-divergence")
    assert first.count() == 1 and "layers.0.out" in first.inner_text()
    # a group's header shows its worst values, in the columns of the rows below it
    head_cells = page.locator("tbody.group.open tr.group-head td.num")
    row_cells = page.locator("tbody.group.open tr.row").first.locator("td.num")
    assert head_cells.first.bounding_box()["x"] == row_cells.first.bounding_box()["x"]  # type: ignore[index]
    assert head_cells.first.inner_text() == "0.25"
    # no cell wraps: every row of the table is one line high, and the table fits its card
    heights = page.evaluate("[...document.querySelectorAll('table.pairs tr.row')].map(r => r.offsetHeight)")
    assert max(heights) == min(heights)
    fits = "document.querySelector('table.pairs').offsetWidth <= document.querySelector('.card').clientWidth"
    assert page.evaluate(fits)
    shot(page, "session-2016-pairs")
    # opening a collapsed group fetches its rows in place
    page.evaluate("window.sameDocument = true")
    page.get_by_role("link", name="Layer 7", exact=True).click()
    page.locator("#group-Layer-7 tr.row").first.wait_for()
    assert page.locator("#group-Layer-7 tr.row").count() == 56
    assert page.evaluate("window.sameDocument") is True
    # ungrouped, 100 rows a page: the next page comes in place
    page.goto(url + "?group=none")
    assert page.locator("tr.row").count() == 100 and elements(page) < 15_000
    page.locator("tr.pager").get_by_role("link", name="next 100 ›").click()
    page.locator("tr.pager", has_text="Pairs 101–200 of 2016").wait_for()


def test_its_row_shows_the_first_divergence_below_the_sticky_header(sessions: Sessions, page: Page) -> None:
    page.goto(f"{sessions.server.url}/sessions/{sessions.heads}")
    assert "9_value" in page.locator(".banner.fail").inner_text()
    page.get_by_role("link", name="its row").click()
    row = page.locator("tr.first-divergence")
    page.wait_for_function("() => window.scrollY > 0")
    top = row.bounding_box()["y"]  # type: ignore[index]
    header = page.locator("table.pairs thead th").first.bounding_box()
    assert header is not None and header["y"] + header["height"] <= top < 900
    assert "9_value" in row.inner_text()
    shot(page, "session-24-layers-its-row")


def test_reordering_keeps_the_page_and_its_scroll(sessions: Sessions, page: Page) -> None:
    page.goto(f"{sessions.server.url}/sessions/{sessions.heads}?group=none")
    rows = page.locator("tr.row")
    target = rows.nth(40)
    name = target.locator("td.name a").inner_text()
    above = rows.nth(39).locator("td.name a").inner_text()
    target.scroll_into_view_if_needed()
    page.evaluate("window.sameDocument = true")
    scrolled = page.evaluate("window.scrollY")
    page.get_by_role("button", name=f"Move {name} up").click()
    page.wait_for_function("() => document.querySelector('table.pairs').dataset.saved === 'yes'")
    assert page.evaluate("window.sameDocument") is True
    assert abs(page.evaluate("window.scrollY") - scrolled) < 5
    assert rows.nth(39).locator("td.name a").inner_text() == name
    assert rows.nth(40).locator("td.name a").inner_text() == above
    page.reload()
    assert page.locator("tr.row").nth(39).locator("td.name a").inner_text() == name
    page.get_by_role("button", name=f"Move {name} down").click()  # back where it was, for the other tests
    page.wait_for_function("() => document.querySelector('table.pairs').dataset.saved === 'yes'")
