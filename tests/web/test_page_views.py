"""The session and pair pages on sessions of real sizes, in headless Chromium: the demo, a 24-layer model whose
divergence is inside one attention head, and a session of 2,016 pairs (64 tensors explored against each other).
One server holds all three for the module (the data built once for the run); screenshots of the views a person
checks go to test-artifacts/."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from playwright.sync_api import Browser, Page, expect
from tensor_debugger.cli.compare_output import compare_request
from tensor_debugger.compare.pipeline import compare_runs
from tensor_debugger.compare.planning.explore import plan_explore
from tensor_debugger.compare.reports.compare_report import to_json
from tensor_debugger.demo.synthetic import DumpShape, Plant, write_dump
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.services import open_services
from tensor_debugger.settings import Settings

from tests.support import loopback_http
from tests.support.browser import ModulePage, axe_context, axe_violations, shot
from tests.support.built_once import built_once, copy_of
from tests.support.dumps import make_zip, seeded
from tests.support.polling import wait_until
from tests.support.servers import LiveServer, free_port, wait_done

pytestmark = pytest.mark.browser

HEADS = DumpShape(tokens=16, heads=8, head_dim=8)
PLANT = Plant(9, "value", (0, 5, 11, 2), 0.5)  # layer 9's values, head 5, token 11


@dataclass(frozen=True)
class Sessions:
    server: LiveServer
    demo: int
    heads: int  # 24 layers, the divergence in one head
    big: int  # 2,016 pairs


def build_sessions(root: Path, demo_data: Path) -> dict[str, int]:
    """A copy of the computed demo, to which this process adds the 24-layer session and the 2,016-pair one through
    the services (as `compare` and `explore` do): these tests are about the pages, and an upload would only make
    the server start its ingest processes and wait for them (tests/web/test_pages.py and test_pairing_pages.py
    upload through the pages)."""
    shutil.copytree(demo_data, root / "data")
    write_dump(root / "ref", 24, seed=3, shape=HEADS)
    write_dump(root / "cand", 24, seed=3, shape=HEADS, plant=PLANT)
    # 64 tensors, each paired with every other: the same values everywhere but in layer 0's
    tensors = {f"layers.{k}.out": seeded((8, 16), 1) for k in range(64)}
    tensors["layers.0.out"] = tensors["layers.0.out"] + 0.25
    torch.save(tensors, root / "acts.pth")
    services = open_services(Settings(data_dir=root / "data", demo=False))
    try:
        request = compare_request(make_zip(root / "ref", root / "ref.zip"),
                                  make_zip(root / "cand", root / "cand.zip"), "24 layers", None, None)  # fmt: skip
        heads = int(
            to_json(compare_runs(services.ingestor, services.context, services.compute, request, "").payload)[
                "session"
            ]["id"]
        )
        big = services.ingestor.ingest("explore acts.pth", "acts.pth", [InputFile(root / "acts.pth", "acts.pth")])
        plan_explore(services.context, big.session_id)
        services.compute(big.session_id)
    finally:
        services.close()
    return {"heads": heads, "big": big.session_id}


@pytest.fixture(scope="module")
def sessions(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Sessions]:
    """A server of the module's own on a copy of the three sessions, built once for the run
    (tests/support/built_once.py: a worker that finds them built needs no demo server of its own)."""
    built, ids = built_once(
        tmp_path_factory, "page-views", lambda root: build_sessions(root, request.getfixturevalue("demo_data"))
    )
    data = copy_of(built / "data", tmp_path_factory.mktemp("page-views") / "data")
    server = LiveServer(data, free_port(), demo=True)
    server.launch()
    try:
        wait_until(server.answers, what="the page-view server to answer", timeout=60, interval=0.02)
        for session_id in (1, ids["heads"], ids["big"]):
            wait_done(server, session_id)
        yield Sessions(server, 1, ids["heads"], ids["big"])
    finally:
        server.stop()


@pytest.fixture(scope="module")
def module_page(browser: Browser) -> Iterator[ModulePage]:
    shared = ModulePage(browser, {"width": 1440, "height": 900})
    yield shared
    shared.close()


@pytest.fixture
def page(module_page: ModulePage) -> Page:
    return module_page.fresh()


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
    page.wait_for_function("() => document.querySelector('table.pairs')?.dataset.saved === 'yes'")
    assert page.evaluate("window.sameDocument") is True
    assert abs(page.evaluate("window.scrollY") - scrolled) < 5
    assert rows.nth(39).locator("td.name a").inner_text() == name
    assert rows.nth(40).locator("td.name a").inner_text() == above
    page.reload()
    assert page.locator("tr.row").nth(39).locator("td.name a").inner_text() == name
    page.get_by_role("button", name=f"Move {name} down").click()  # back where it was, for the other tests
    page.wait_for_function("() => document.querySelector('table.pairs')?.dataset.saved === 'yes'")


def pair_named(sessions: Sessions, session_id: int, name: str) -> int:
    pairs = loopback_http.get(f"{sessions.server.url}/api/sessions/{session_id}/pairs", timeout=30).json()["pairs"]
    return int(next(p["id"] for p in pairs if p["name"] == name))


def test_the_pair_page_opens_where_the_error_is(sessions: Sessions, page: Page) -> None:
    url = f"{sessions.server.url}/pairs/{pair_named(sessions, sessions.heads, '9_value')}"
    page.goto(url)  # values [1, 8, 16, 8]: the difference is in head 5, token 11, element 2
    caption = page.locator(".caption")
    assert caption.inner_text().startswith("Window [0, 5, 11, 0:8]")
    assert "largest difference here at [0, 5, 11, 2]" in caption.inner_text()
    biggest = page.locator("figure.grid", has_text="Difference").locator("td.max")
    assert "candidate − reference 0.5;" in (biggest.get_attribute("title") or "")
    heatmap = page.locator("figure.heatmap img")
    assert "fixed=0%2C5%2C%3A%2C%3A" in (heatmap.get_attribute("src") or "")  # head 5's slice
    assert page.locator("figure.heatmap figcaption").inner_text().startswith("Heatmap of the difference over [0,5,:,:]")
    # sliders for the three dimensions that have more than one index, none for the batch of 1
    assert page.locator(".sliders .slider").count() == 3
    assert "dim 0" not in page.locator(".sliders").inner_text()
    # the three grids side by side, in one scroll area
    tops = [box["y"] for box in (g.bounding_box() for g in page.locator(".grids figure.grid").all()) if box]
    assert len(tops) == 3 and max(tops) == min(tops)
    shot(page, "pair-head-5")
    # the heatmap follows the window without a reload; a click on a cell opens that spot
    page.evaluate("window.sameDocument = true")
    page.locator("body").press("ArrowDown")  # the next token
    page.wait_for_function("() => document.querySelector('.caption').textContent.includes('[0, 5, 12, ')")
    page.locator("body").press("ArrowUp")
    page.wait_for_function("() => document.querySelector('.caption').textContent.includes('[0, 5, 11, ')")
    page.get_by_label("dim 1 (size 8)", exact=True).fill("2")  # head 2: the heatmap moves to its slice
    page.wait_for_function("() => document.querySelector('figure.heatmap img').src.includes('fixed=0%2C2%2C')")
    # head 2's map (16 tokens x 8 elements, a cell each): a click on token 3, element 4 opens that spot
    cells = page.locator("figure.heatmap .heatmap-image")
    cells.scroll_into_view_if_needed()
    box = cells.bounding_box()
    assert box is not None
    page.mouse.click(box["x"] + box["width"] * 4.5 / 8, box["y"] + box["height"] * 3.5 / 16)
    page.wait_for_function("() => document.querySelector('.caption').textContent.startsWith('Window [0, 2, 3, 0:8]')")
    assert page.evaluate("window.sameDocument") is True and "index=0%2C2%2C3%2C%3A" in page.url


def test_a_bad_index_is_said_next_to_the_form(sessions: Sessions, page: Page) -> None:
    pair = pair_named(sessions, sessions.heads, "9_value")
    answer = page.goto(f"{sessions.server.url}/pairs/{pair}?index=0,99,0,:&start=0&count=8")
    assert answer is not None and answer.status == 200
    error = page.locator("#window-error")
    assert "index 99 is out of range for dimension 1 of size 8" in error.inner_text()
    expect(page.get_by_role("heading", name="9_value")).to_be_visible()
    assert page.locator("form.window input[name=index]").input_value() == "0,99,0,:"  # as typed
    assert page.locator("figure.grid").count() == 3  # the largest difference shown meanwhile


def test_the_chart_zooms_reads_and_filters_the_table(sessions: Sessions, page: Page) -> None:
    page.goto(f"{sessions.server.url}/sessions/{sessions.heads}")
    chart = page.locator("figure.chart")
    over = chart.locator(".u-over")
    over.wait_for()
    over.scroll_into_view_if_needed()  # below the worst pairs: the mouse reads it only in the window
    assert chart.locator("svg.static-chart").is_hidden()  # the server's SVG is for browsers without scripts
    focusable = "a[href], button, input, select, [tabindex]:not([tabindex='-1'])"
    assert chart.locator(focusable).count() == 1  # the chart is one tab stop
    box = over.bounding_box()
    assert box is not None
    # the crosshair reads the pair under the pointer
    page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.5)
    assert re.match(r"#\d+ \d+_\w+ \(layer 1[12]\): (pass|fail)", chart.locator(".chart-readout").inner_text())
    # the keyboard moves it, from the first divergence
    chart.locator(".chart-plot").focus()
    page.keyboard.press("ArrowRight")
    assert chart.locator(".chart-readout").inner_text().startswith("#")
    # dragging across layers 2 to 5 zooms there and filters the table to those pairs, without a reload
    page.evaluate("window.sameDocument = true")
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 2.2 / 24, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 5.8 / 24, y, steps=5)
    page.mouse.up()
    page.wait_for_function("() => location.search.includes('lo=')")
    note = page.locator(".range-note")
    note.wait_for()
    layers = {int(name.split("_")[0]) for name in page.locator("tr.row td.name a").all_inner_texts()}
    heads = {int(t.split()[1]) for t in page.locator("tr.group-head a.toggle").all_inner_texts()}
    assert heads and heads <= set(range(1, 7)) and layers <= heads
    assert page.evaluate("window.sameDocument") is True
    shot(page, "session-24-layers-chart-range")
    page.get_by_role("link", name="Show every pair").click()
    page.wait_for_url(re.compile(r"/sessions/\d+\?$|/sessions/\d+$"))
    assert page.locator("tr.group-head").count() == 24


def test_runs_are_named_for_their_files_and_list_tensors_in_execution_order(sessions: Sessions, page: Page) -> None:
    page.goto(f"{sessions.server.url}/sessions/{sessions.heads}")
    assert page.locator(".runs-header").inner_text().split() == ["reference:", "ref.zip", "candidate:", "cand.zip"]
    page.get_by_role("link", name="Candidate run: cand.zip").click()
    page.locator("table.tensors td:first-child").first.wait_for()  # the run's page, loaded (not the one clicked on)
    names = page.locator("table.tensors td:first-child").all_inner_texts()
    assert names[:3] == ["0_post_ln_pre_attn", "0_query", "0_query_final"]  # execution order, not the zip's
    assert names.index("9_value") < names.index("10_post_ln_pre_attn") and len(names) == 24 * 13
    shot(page, "run-24-layers")
    page.get_by_label("Name contains").fill("9_value")
    page.get_by_role("button", name="Search").click()
    expect(page.locator("table.tensors td:first-child")).to_have_text(  # once the search's page has loaded
        ["9_value", "9_value_final", "19_value", "19_value_final"]
    )
    page.get_by_role("link", name="9_value", exact=True).click()
    page.get_by_role("heading", name="9_value").wait_for()
    # a label can be changed; another run's label is refused
    page.goto(f"{sessions.server.url}/sessions/{sessions.heads}")
    runs = page.locator("section.runs")
    runs.locator("details.relabel summary").nth(1).click()
    runs.get_by_label("Label of the candidate run").fill("fixed kernel")
    runs.locator("details.relabel[open] button[type=submit]").click()
    page.wait_for_url("**#runs")
    assert "candidate: fixed kernel" in page.locator(".runs-header").inner_text()
    runs.locator("details.relabel summary").nth(1).click()
    runs.get_by_label("Label of the candidate run").fill("cand.zip")  # back, for the other tests
    runs.locator("details.relabel[open] button[type=submit]").click()
    page.wait_for_url("**#runs")


def every_page(sessions: Sessions) -> dict[str, str]:
    """A name for the screenshots, and the address of each kind of page."""
    base = sessions.server.url
    first = pair_named(sessions, sessions.heads, "9_value")
    run = loopback_http.get(f"{base}/api/sessions/{sessions.heads}", timeout=30).json()["runs"][1]["id"]
    return {
        "sessions": "/",
        "session-demo": f"/sessions/{sessions.demo}",
        "session-24-layers": f"/sessions/{sessions.heads}",
        "session-2016-pairs-ungrouped": f"/sessions/{sessions.big}?group=none",
        "pair": f"/pairs/{first}",
        "pair-manual": f"/pairs/{first}?mode=manual",
        "run": f"/runs/{run}",
        "not-found": "/sessions/999999",
    }


PHONE_SHOTS = {"session-24-layers", "pair"}  # the other pages' wide views are in the other tests' screenshots
# axe at 1440 px on every page but these: each shows no element (tag, classes, role, colour and background) that
# another page axe checks at that width does not (bench/RESULTS.md, "tests/web's CPU, round 4"): the sessions list
# is test_glance_pages.py's, the 24-layer session's elements are the demo session's (3,948 elements:
# the dearest page for axe), the pair page's are in its manual mode's
SAME_ELEMENTS = {"sessions", "session-24-layers", "pair"}
# axe at 390 px too on the run and error pages, which no other test checks on a phone (the session, pair and
# sessions pages are checked at 390 px in test_glance_pages.py)
AXE_ON_A_PHONE = {"run", "not-found"}


def test_every_page_passes_axe_and_fits_a_phone(sessions: Sessions, browser: Browser) -> None:
    """No horizontal scrolling at 390 px (the page's scrollWidth, which a screenshot would show as a cut-off page),
    and no serious or critical axe-core violation once the same page is widened to 1440 px (but on the pages in
    SAME_ELEMENTS), nor at 390 px on those in AXE_ON_A_PHONE; a screenshot of the phone views of the pages people
    look at on one. Each page is loaded once, on the phone (a fresh load is what a phone shows; axe looks at the
    document, which a wider window lays out again; axe is in each page from its start: tests/support/browser.py's
    `axe_context`)."""
    found: list[str] = []
    missing: list[str] = []  # files the pages asked for in vain (the favicon, say)
    context = axe_context(browser, {"width": 390, "height": 844})
    page = context.new_page()
    page.on("response", lambda r: missing.append(r.url) if r.status == 404 and "/sessions/" not in r.url else None)
    for name, path in every_page(sessions).items():
        page.set_viewport_size({"width": 390, "height": 844})
        page.goto(sessions.server.url + path)
        page.wait_for_load_state("load")
        wide = page.evaluate("document.documentElement.scrollWidth")
        if wide > 390:
            found.append(f"{name}: {wide} px wide at 390 px")
        if name in PHONE_SHOTS:
            shot(page, f"{name}-390")
        assert page.locator("a.skip").count() == 1, name
        if name in AXE_ON_A_PHONE:
            found += [f"{name} at 390 px: {v}" for v in axe_violations(page)]
        if name not in SAME_ELEMENTS:
            page.set_viewport_size({"width": 1440, "height": 900})
            found += [f"{name}: {v}" for v in axe_violations(page)]
    assert not missing, missing
    context.close()
    assert not found, "\n".join(found)


def test_reordering_without_scripts_comes_back_to_the_row(sessions: Sessions, browser: Browser) -> None:
    context = browser.new_context(viewport={"width": 1440, "height": 900}, java_script_enabled=False)
    page = context.new_page()
    page.goto(f"{sessions.server.url}/sessions/{sessions.heads}?group=none&open=all&page=1")
    first = page.locator("tr.row").first  # the 101st pair
    name = first.locator("td.name a").inner_text()
    page.get_by_role("button", name=f"Move {name} up").click()  # onto the first page's last row
    page.wait_for_url(re.compile(r"group=none&open=all&page=0#pair-\d+$"))
    assert page.locator("tr.row").nth(99).locator("td.name a").inner_text() == name
    page.get_by_role("button", name=f"Move {name} down").click()  # back to the second page
    page.wait_for_url(re.compile(r"group=none&open=all&page=1#pair-\d+$"))
    assert page.locator("tr.row").first.locator("td.name a").inner_text() == name
    context.close()
