"""Pages that read at a glance (issue 30), in headless Chromium on one server for the module: a traced tiny Llama
(long module names) and a 64 x 256 pair named `model.layers.17.self_attn.o_proj` beside its `...k_proj` twin.
Long names are cut in the middle and stay told apart, no page scrolls sideways at 390 px, axe-core finds nothing
serious at 390 and 1,440 px, the heatmap is one PNG with its axes, the window marked on it, a read-out and a click
that moves the window, and the value grids keep their captions in view, stacked or side by side."""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from urllib.parse import parse_qsl, urlsplit

import pytest
from playwright.sync_api import Browser, Page

from tests.support import loopback_http
from tests.support.browser import ModulePage, axe_context, axe_violations, shot
from tests.support.built_once import built_once, copy_of
from tests.support.glance_sessions import LONG_NAME, SPOT, GlanceSessions, build_glance_sessions
from tests.support.polling import wait_until
from tests.support.servers import LiveServer, free_port, wait_done

pytestmark = pytest.mark.browser


@dataclass(frozen=True)
class Glance:
    server: LiveServer
    sessions: GlanceSessions

    def pair(self, session: int, name: str) -> int:
        pairs = loopback_http.get(f"{self.server.url}/api/sessions/{session}/pairs", timeout=30).json()["pairs"]
        return int(next(p["id"] for p in pairs if p["name"].endswith(name)))


@pytest.fixture(scope="module")
def glance(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Glance]:
    """A server of the module's own on a copy of the sessions, built once for the run (tests/support/built_once.py:
    a worker that finds them built needs no traces of its own)."""
    built, ids = built_once(
        tmp_path_factory,
        "glance",
        lambda root: asdict(build_glance_sessions(root / "data", root, request.getfixturevalue("hf_traces"))),
    )
    sessions = GlanceSessions(**ids)
    server = LiveServer(copy_of(built / "data", tmp_path_factory.mktemp("glance") / "data"), free_port())
    server.launch()
    try:
        wait_until(server.answers, what="the glance server to answer", timeout=60, interval=0.02)
        for session_id in (sessions.trace, sessions.wide, sessions.named, sessions.fixed):
            wait_done(server, session_id)
        yield Glance(server, sessions)
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


# the pages whose elements, at both widths, are all on a page axe checks: compare-sessions with `changed`
# filtered shows a subset of the rows of compare-sessions unfiltered; profiles by number the same elements as by name
SAME_ELEMENTS = {"compare-changed", "profiles-by-number"}


def test_pages_fit_a_phone_and_pass_axe(glance: Glance, browser: Browser) -> None:
    """document.scrollWidth within the viewport at 390 and 1,440 px on the session, pair, compare-sessions, graph and
    profiles pages (a trace's among them), and no serious or critical axe-core violation at 390 and at 1,440 px on
    each of them but the two in SAME_ELEMENTS: each of those shows no element (tag, classes, role, colour and
    background, as laid out at either width) that another page axe checks at that width does not show too
    (bench/RESULTS.md, "tests/web's CPU, round 4"), and axe on it cost a second or two of Chromium for nothing."""
    s = glance.sessions
    pages = {
        "trace-session": f"/sessions/{s.trace}",
        "trace-pair": f"/pairs/{glance.pair(s.trace, 'mlp.down_proj_outputs')}",
        "wide-session": f"/sessions/{s.wide}",
        "wide-pair": f"/pairs/{glance.pair(s.wide, LONG_NAME)}",
        "compare-sessions": f"/sessions/compare?a={s.trace}&b={s.fixed}",
        "compare-changed": f"/sessions/compare?a={s.trace}&b={s.fixed}&changed=true",
        "sessions": "/",
        "graph": f"/sessions/{s.trace}/graph",
        "graph-search": f"/sessions/{s.trace}/graph?q=down_proj",
        "profiles-named": f"/sessions/{s.named}/profiles",
        "profiles-by-number": f"/sessions/{s.named}/profiles?dim=2",
    }
    found: list[str] = []
    context = axe_context(browser, {"width": 390, "height": 844})  # axe in each page from its start
    page = context.new_page()
    for name, path in pages.items():
        page.set_viewport_size({"width": 390, "height": 844})  # loaded on a phone, as a phone shows it
        page.goto(glance.server.url + path)
        page.wait_for_load_state("load")
        for width in (390, 1440):
            page.set_viewport_size({"width": width, "height": 844 if width == 390 else 900})
            wide = page.evaluate("document.documentElement.scrollWidth")
            if wide > width:
                found.append(f"{name}: {wide} px wide at {width} px")
            if width == 390:
                shot(page, f"glance-{name}-390")
            if name not in SAME_ELEMENTS:
                found += [f"{name} at {width} px: {v}" for v in axe_violations(page)]
    context.close()
    assert not found, "\n".join(found)


def test_long_names_are_cut_in_the_middle_and_told_apart(glance: Glance, page: Page) -> None:
    page.goto(f"{glance.server.url}/sessions/{glance.sessions.wide}?group=none")
    names = page.locator("table.pairs td.name a")
    assert names.count() == 2
    for i in range(2):
        link = names.nth(i)
        full = (link.get_attribute("title") or "").split(" ↔ ")[0]  # the full name on hover
        assert full.endswith(("self_attn.o_proj", "self_attn.k_proj")), full
        assert link.text_content() == full == link.inner_text()  # the whole name is the text, on one line
        tail = link.locator(".tail")
        assert tail.inner_text() == full[-len("self_attn.o_proj") :]
        # the tail shows whole, inside the cell: only the head gives way
        fits = tail.evaluate(
            "t => t.scrollWidth <= t.clientWidth + 1"
            " && t.getBoundingClientRect().right <= t.closest('td').getBoundingClientRect().right + 1"
        )
        assert fits, full
    for column in ("shape", "alignment"):  # shape and alignment are not cut
        cell = page.locator(f"table.pairs td.{column}").first
        assert cell.evaluate("c => c.scrollWidth <= c.clientWidth + 1"), column
    page.set_viewport_size({"width": 390, "height": 844})
    head = names.first.locator(".head")
    # cut at 390 px, in the middle: the head gives way but still shows its start and the ellipsis
    assert head.evaluate("h => h.scrollWidth > h.clientWidth && h.clientWidth >= 12")
    for i in range(2):  # and the tail still shows whole
        tail = names.nth(i).locator(".tail")
        assert tail.evaluate(
            "t => t.getBoundingClientRect().right <= t.closest('.mid').getBoundingClientRect().right + 1"
        )
    shot(page, "glance-names-390")


def test_the_heatmap_is_one_png_marks_the_window_reads_out_and_moves_it(glance: Glance, page: Page) -> None:
    pair = glance.pair(glance.sessions.wide, LONG_NAME)
    page.goto(f"{glance.server.url}/pairs/{pair}")
    figure = page.locator("figure.heatmap")
    assert figure.locator("svg rect:not(.window-mark):not(.cursor)").count() == 0  # no SVG element per cell
    src = figure.locator("img").get_attribute("src") or ""
    png = loopback_http.get(glance.server.url + src.replace("&amp;", "&"), timeout=30)
    assert png.headers["content-type"] == "image/png" and png.content[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png.content[16:24])
    assert (height, width) == (64, 96)  # a pixel per cell: 64 rows, 256 columns pooled into 96
    idat = png.content[png.content.index(b"IDAT") + 4 : png.content.index(b"IEND") - 8]
    pixels = zlib.decompress(idat)
    row, col = SPOT[0], SPOT[1] * 96 // 256  # the spot's cell is the darkest red: 0.5 against 1e-4 elsewhere
    at = row * (1 + width * 3) + 1 + col * 3
    assert tuple(pixels[at : at + 3]) == (165, 15, 21)
    # axes: ticks with indices on both, titles naming the dimensions
    ticks = [t.text_content() for t in figure.locator("svg.ticks.cols text").all()]
    assert ticks == ["0", "50", "100", "150", "200", "250"]
    assert [t.text_content() for t in figure.locator("svg.ticks.rows text").all()] == ["0", "20", "40", "60"]
    assert "dimension 1 (index, 256)" in figure.locator(".axis-title.cols").inner_text()
    # the page opens on the largest difference: the window (row 40) is marked on the map
    mark = figure.locator("rect.window-mark")
    assert mark.count() == 1 and float((mark.get_attribute("y") or "0").rstrip("%")) == pytest.approx(100 * 40 / 64)
    # the read-out follows the pointer; the legend gets the scale's end
    figure.locator(".heatmap-image").scroll_into_view_if_needed()
    box = figure.locator(".heatmap-image").bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] * (col + 0.5) / 96, box["y"] + box["height"] * (row + 0.5) / 64)
    readout = figure.locator(".heatmap-readout")
    page.wait_for_function("() => document.querySelector('.heatmap-readout').textContent.includes('0.5')")
    assert readout.inner_text().startswith(f"rows {row}, columns ")
    assert figure.locator(".legend-high").inner_text().startswith("+0.5")
    # a click elsewhere moves the window there, without a reload; the mark follows
    page.evaluate("window.sameDocument = true")
    page.mouse.click(box["x"] + box["width"] * 0.5 / 96, box["y"] + box["height"] * 10.5 / 64)  # no scroll since
    page.wait_for_function("() => document.querySelector('.caption').textContent.startsWith('Window [10, ')")
    assert page.evaluate("window.sameDocument") is True
    mark = page.locator("figure.heatmap rect.window-mark")
    assert float((mark.get_attribute("y") or "0").rstrip("%")) == pytest.approx(100 * 10 / 64)
    # the keys: focus the map, End goes to the row's last cell, Enter opens it
    page.locator(".heatmap-image").focus()
    page.keyboard.press("Control+End")
    assert page.locator(".heatmap-readout").inner_text().startswith("rows 63, columns ")
    page.keyboard.press("Home")
    assert page.locator(".heatmap-readout").inner_text().startswith("rows 63, columns 0–")
    page.keyboard.press("Enter")
    page.wait_for_function("() => document.querySelector('.caption').textContent.startsWith('Window [63, ')")
    shot(page, "glance-heatmap")


def test_grids_keep_their_captions_stacked_or_side_by_side(glance: Glance, page: Page) -> None:
    pair = glance.pair(glance.sessions.wide, LONG_NAME)
    page.goto(f"{glance.server.url}/pairs/{pair}#inspector")
    captions = page.locator(".grids figure.grid figcaption")
    assert captions.all_inner_texts() == ["Reference", "Candidate", "Difference (candidate - reference)"]
    # side by side at 1,440 px, opened on the largest difference with every caption in view
    tops = [c.bounding_box()["y"] for c in captions.all()]  # type: ignore[index]
    assert max(tops) == min(tops)
    area = page.locator(".grids").bounding_box()
    assert area is not None and all(area["y"] - 1 <= t <= area["y"] + area["height"] for t in tops)
    toggle = page.locator("button.layout-toggle")
    assert toggle.get_attribute("aria-pressed") == "true"
    toggle.click()  # stacked: one under the other, the choice kept for the next page
    tops = [c.bounding_box()["y"] for c in captions.all()]  # type: ignore[index]
    assert tops == sorted(tops) and len(set(tops)) == 3
    page.reload()
    assert page.locator("section.inspector").get_attribute("class") is not None
    assert "layout-stacked" in (page.locator("section.inspector").get_attribute("class") or "")
    page.locator("button.layout-toggle").click()  # back to side by side
    page.set_viewport_size({"width": 390, "height": 844})
    page.evaluate("localStorage.clear()")
    page.reload()
    assert "layout-stacked" in (page.locator("section.inspector").get_attribute("class") or "")  # narrow: stacked
    shot(page, "glance-grids-390")


def test_the_grids_column_header_stays_under_its_caption(glance: Glance, page: Page) -> None:
    """A 1-D window of 256 values side by side at 1,440 px is taller than the grids' scroll area: scrolled to its
    end, each grid's caption and its "+0, +1, ..." header row are still in view, the header row right under the
    caption, over the values scrolled beneath it."""
    pair = glance.pair(glance.sessions.wide, LONG_NAME)
    page.goto(f"{glance.server.url}/pairs/{pair}?index=40,:&start=0&count=256#inspector")
    area = page.locator(".grids.flow")
    page.wait_for_function("() => document.querySelector('.grids.flow th[scope=col]') !== null")
    assert area.evaluate("a => a.scrollHeight > a.clientHeight + 100")  # it scrolls
    area.evaluate("a => { a.scrollTop = a.scrollHeight; }")
    box = area.bounding_box()
    assert box is not None
    for figure in page.locator(".grids.flow figure.grid").all():
        caption = figure.locator("figcaption").bounding_box()
        head = figure.locator("th[scope=col]").first.bounding_box()
        assert caption is not None and head is not None
        assert box["y"] - 1 <= caption["y"] and head["y"] + head["height"] <= box["y"] + box["height"]
        assert caption["y"] + caption["height"] - 1 <= head["y"] <= caption["y"] + caption["height"] + 4
        # what is drawn at the header's place is the header, not a value scrolled under it
        on_top = page.evaluate(
            "([x, y]) => document.elementFromPoint(x, y).closest('th, figcaption')?.tagName ?? ''",
            [head["x"] + head["width"] / 2, head["y"] + head["height"] / 2],
        )
        assert on_top == "TH"
    shot(page, "glance-grids-sticky-header")


def test_a_1d_window_fills_the_width_side_by_side_stacked_and_on_a_phone(glance: Glance, page: Page) -> None:
    """The default window is 1-D, 64 values of the row with the largest difference: laid out as many a row as fit
    each grid's width (the same number in the three grids, rows headed by their first index, columns by their
    offset), side by side at 1,440 px (the three grids fill the width), more a row stacked, and at 390 px stacked
    with no page overflow; the captions stay in view and the heatmap marks the window's row and columns."""
    pair = glance.pair(glance.sessions.wide, LONG_NAME)
    page.goto(f"{glance.server.url}/pairs/{pair}#inspector")
    assert page.locator(".caption").inner_text().startswith("Window [40, 168:232]")  # the largest, at [40, 200]

    def layout() -> tuple[int, list[list[str]]]:
        """Values a row (the same in every grid) and each grid's row labels; each cell's index is its row's label
        plus its column's offset."""
        per_row = page.evaluate(
            """() => [...document.querySelectorAll('.grids.flow table.values')].map(t => {
                const rows = [...t.rows].filter(r => r.querySelector('th[scope=row]'));
                return rows[0].querySelectorAll('td').length;
            })"""
        )
        assert len(per_row) == 3 and len(set(per_row)) == 1, per_row
        labels = [t.locator("th[scope=row]").all_inner_texts() for t in page.locator(".grids.flow table.values").all()]
        n = per_row[0]
        for grid in labels:
            assert grid == [str(168 + k * n) for k in range(-(-64 // n))]
        if n > 1:
            offsets = page.locator(".grids.flow table.values").first.locator("th[scope=col]").all_inner_texts()
            assert offsets == [f"+{k}" for k in range(n)]
        second = page.locator(".grids.flow table.values").nth(1).locator("tr").nth(2 if n > 1 else 1)
        cell = second.locator("td").nth(min(n - 1, 2))
        assert (cell.get_attribute("title") or "").startswith(f"[40, {168 + n + min(n - 1, 2)}] value ")
        return n, labels

    def fills() -> None:
        area = page.locator(".grids.flow").bounding_box()
        figures = [f.bounding_box() for f in page.locator(".grids.flow figure.grid").all()]
        assert area is not None and all(f is not None for f in figures)
        tables_fit = page.evaluate(
            "() => [...document.querySelectorAll('.grids.flow figure.grid')]"
            ".every(f => f.querySelector('table').getBoundingClientRect().width <= f.clientWidth + 1)"
        )
        assert tables_fit
        captions = [c.bounding_box() for c in page.locator(".grids figure.grid figcaption").all()]
        assert all(c is not None and area["y"] - 1 <= c["y"] <= area["y"] + area["height"] for c in captions)
        assert page.evaluate("document.documentElement.scrollWidth") <= page.viewport_size["width"]  # type: ignore[index]

    # side by side at 1,440 px: the three grids share the width, several values a row in each
    side, _ = layout()
    assert side >= 4
    figures = [f.bounding_box() for f in page.locator(".grids.flow figure.grid").all()]
    area = page.locator(".grids.flow").bounding_box()
    assert area is not None and sum(f["width"] for f in figures if f) >= 0.9 * area["width"]
    fills()
    # the heatmap marks row 40 and columns 168-231: the window's (its 96 columns pool 256, so within a column)
    mark = page.locator("figure.heatmap rect.window-mark")
    assert float((mark.get_attribute("y") or "").rstrip("%")) == pytest.approx(100 * 40 / 64)
    assert float((mark.get_attribute("height") or "").rstrip("%")) == pytest.approx(100 / 64)
    assert float((mark.get_attribute("x") or "").rstrip("%")) == pytest.approx(100 * 168 / 256, abs=100 / 96)
    assert float((mark.get_attribute("width") or "").rstrip("%")) == pytest.approx(100 * 64 / 256, abs=2 * 100 / 96)
    shot(page, "glance-window-side-1440")
    # stacked: each grid the whole width, more values a row
    page.locator("button.layout-toggle").click()
    stacked, _ = layout()
    assert stacked > 2 * side
    fills()
    shot(page, "glance-window-stacked-1440")
    page.locator("button.layout-toggle").click()  # back to side by side (kept in localStorage)
    # a phone: stacked by default, a few values a row, nothing past the screen's edge
    page.set_viewport_size({"width": 390, "height": 844})
    page.evaluate("localStorage.clear()")
    page.reload()
    phone, _ = layout()
    assert 2 <= phone < side * 3
    fills()
    shot(page, "glance-window-390")


def test_charts_have_axes_read_outs_and_keys(glance: Glance, page: Page) -> None:
    """The pair page's error profile and histogram have axes with ticks, labels and units; the profile and the
    session chart read out the values under the pointer or the keys (arrows, Home, End)."""
    pair = glance.pair(glance.sessions.wide, LONG_NAME)
    page.goto(f"{glance.server.url}/pairs/{pair}?profile=0#profile")
    chart = page.locator("figure.profile-chart")
    assert chart.locator(".axis-title.y").inner_text() == "|diff| (log scale)"
    assert chart.locator(".axis-title.x").inner_text() == "index of aligned dimension 0 (size 64)"
    x_ticks = [t.text_content() for t in chart.locator("svg.ticks.x text").all()]
    assert x_ticks == ["0", "10", "20", "30", "40", "50", "60"]
    y_ticks = [t.text_content() or "" for t in chart.locator("svg.ticks.y text").all()]
    assert y_ticks and all(t.startswith("1e") for t in y_ticks)
    readout = chart.locator(".profile-readout")
    chart.locator(".plot").focus()
    page.keyboard.press("End")
    assert readout.inner_text().startswith("index 63: max |diff| ")
    page.keyboard.press("Home")
    assert readout.inner_text().startswith("index 0: max |diff| ")
    plot = chart.locator(".plot svg").bounding_box()
    assert plot is not None
    page.mouse.move(plot["x"] + plot["width"] * 40 / 63, plot["y"] + plot["height"] / 2)  # row 40 holds the 0.5
    assert readout.inner_text().startswith("index 40: max |diff| 0.5")
    assert "elements outside tolerance" in readout.inner_text()
    shot(page, "glance-profile")
    # the session page's chart: Home and End read out the first and the last pair
    page.goto(f"{glance.server.url}/sessions/{glance.sessions.trace}")
    holder = page.locator("#chart .chart-plot")
    holder.focus()
    page.keyboard.press("End")
    last = page.locator(".chart-readout").inner_text()
    # the model's logits, the last pair (its index depends on the modules transformers' version traces)
    assert re.match(r"#[1-9]\d* LlamaForCausalLM_outputs_logits: fail, max \|diff\| ", last), last
    page.keyboard.press("Home")
    assert page.locator(".chart-readout").inner_text().startswith("#0 ")


def test_the_histogram_has_axes_a_read_out_under_the_pointer_and_keys(glance: Glance, page: Page) -> None:
    """The pair page's histogram of |diff| per decade: both axes titled, the count axis ticked on its log scale; the
    bar under the pointer is marked and read out with its exact range, its count and its share (the pair's own
    statistics from the API); focused, ↓ ↑ Home End step the bars (the profile's keys, chart_keys.js)."""
    pair = glance.pair(glance.sessions.wide, LONG_NAME)
    counts = loopback_http.get(f"{glance.server.url}/api/pairs/{pair}", timeout=30).json()["stats"]["histogram"]
    total = sum(counts)
    page.goto(f"{glance.server.url}/pairs/{pair}#histogram")
    chart = page.locator("figure.histogram-chart")
    heads = chart.locator("thead th").all_inner_texts()
    assert heads[0] == "|diff| decade" and heads[1] == "Elements (bar: log scale)"
    assert page.evaluate("document.documentElement.scrollWidth") <= 1440  # the chart fits its card
    assert chart.locator(".axis-title.x").inner_text() == "elements per decade (log scale)"
    ticks = [t.text_content() for t in chart.locator("svg.bar-axis text").all()]
    assert ticks[:3] == ["0", "1", "10"] and len(ticks) == 1 + len(str(max(counts)))
    labels = chart.locator("tbody th").all_inner_texts()
    assert labels[0] == "0" and labels[1] == "< 1e-11" and labels[-1] == "≥ 1e4" and len(labels) == len(counts)
    readout = chart.locator(".histogram-readout")
    bars = chart.locator("tbody tr")
    # the pointer over the bar of 1e-5 (the 1e-4 noise's decade below it holds many elements)
    busiest = max(range(2, len(counts) - 1), key=lambda i: counts[i])
    row = bars.nth(busiest).bounding_box()
    assert row is not None
    page.mouse.move(row["x"] + row["width"] / 2, row["y"] + row["height"] / 2)
    decade = int(labels[busiest].removeprefix("1e"))
    share = f"{100 * counts[busiest] / total:.3g}%"
    assert readout.inner_text() == (
        f"|diff| 1e{decade} up to 1e{decade + 1}: {counts[busiest]:,} elements ({share} of {total:,})"
    )
    assert "at" in (bars.nth(busiest).get_attribute("class") or "").split()
    # the keys: Home the exact zeros, End the top decade, ↑ one back
    chart.locator(".histogram-plot").focus()
    page.keyboard.press("Home")
    assert readout.inner_text().startswith(f"|diff| exactly 0: {counts[0]:,} element")
    page.keyboard.press("End")
    assert readout.inner_text().startswith(f"|diff| 1e4 or more (Inf included): {counts[-1]:,} element")
    page.keyboard.press("ArrowUp")
    assert readout.inner_text().startswith(f"|diff| 1e3 up to 1e4: {counts[-2]:,} element")
    assert chart.locator("tbody tr.at").count() == 1
    page.keyboard.press("ArrowDown")
    assert readout.inner_text().startswith("|diff| 1e4 or more")
    chart.scroll_into_view_if_needed()
    shot(page, "glance-histogram")


def test_compare_sessions_links_both_pairs_filters_changes_and_overlays_both_errors(glance: Glance, page: Page) -> None:
    """Did my fix help: every pair name links to its pair in A and in B; "changed only" (a query parameter, a
    checkbox in the form) leaves out the pairs that stayed the same; A's and B's error share one chart with axes, a
    legend, a crosshair read-out and keys."""
    s = glance.sessions
    diff = loopback_http.get(f"{glance.server.url}/api/sessions/compare?a={s.trace}&b={s.fixed}", timeout=30).json()
    page.goto(f"{glance.server.url}/sessions/compare?a={s.trace}&b={s.fixed}")
    rows = page.locator("table.session-diff tbody tr")
    assert rows.count() == len(diff["pairs"])
    first = diff["pairs"][0]
    sides = rows.first.locator("td.name .sides a")
    assert [a.get_attribute("href") for a in sides.all()] == [f"/pairs/{first['pair_a']}", f"/pairs/{first['pair_b']}"]
    sides.nth(1).click()
    page.wait_for_url(f"**/pairs/{first['pair_b']}")
    page.go_back()
    # changed only: through the form's checkbox, without scripts' help (a GET form)
    page.locator("input[name=changed]").check()
    page.locator("form.compare-sessions button[type=submit]").click()
    page.wait_for_url("**changed=true**")
    changed = [p for p in diff["pairs"] if p["change"] != "same"]
    assert 0 < len(changed) < len(diff["pairs"])
    assert page.locator("table.session-diff tbody tr").count() == len(changed)
    assert {c.strip() for c in page.locator("table.session-diff td.change").all_inner_texts()} == {
        p["change"] for p in changed
    }
    # the chart: A and B overlaid, axes with ticks and titles, a legend naming both sessions
    chart = page.locator("figure.diff-chart")
    assert chart.locator(".chart-legend li").all_inner_texts() == [
        f"A: {diff['a']['name']} (#{s.trace})",
        f"B: {diff['b']['name']} (#{s.fixed})",
    ]
    page.wait_for_function("() => document.querySelector('figure.diff-chart').classList.contains('live')")
    assert chart.locator("canvas").count() == 1  # uPlot draws its axes, ticks and titles on the canvas
    holder = chart.locator(".chart-plot")
    holder.focus()
    readout = chart.locator(".chart-readout")
    page.keyboard.press("End")
    last = diff["pairs"][-1]
    assert readout.inner_text().startswith(f"#{len(diff['pairs']) - 1} {last['key']}")
    page.keyboard.press("Home")
    assert readout.inner_text().startswith(f"#0 {first['key']}")
    page.keyboard.press("ArrowRight")
    second = diff["pairs"][1]
    assert readout.inner_text().startswith(f"#1 {second['key']}")
    assert f"; {second['change']}" in readout.inner_text() and "A " in readout.inner_text()
    # the crosshair follows the pointer: the plot's middle reads out the pair there
    box = chart.locator(".u-over").bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    middle = round((len(diff["pairs"]) - 1) / 2)
    page.wait_for_function(
        "m => document.querySelector('.chart-readout').textContent.startsWith(`#${m} `)"
        " || document.querySelector('.chart-readout').textContent.startsWith(`#${m - 1} `)"
        " || document.querySelector('.chart-readout').textContent.startsWith(`#${m + 1} `)",
        arg=middle,
    )
    shot(page, "glance-compare-sessions")
    # the static chart (what a page without scripts shows): both lines, ticks on both axes, both titles
    page.goto(f"{glance.server.url}/sessions/compare?a={s.trace}&b={s.fixed}")
    page.evaluate("document.querySelector('figure.diff-chart').classList.remove('live')")
    static = chart.locator("svg.static-chart")
    assert static.locator("path.line.a").get_attribute("d") and static.locator("path.line.b").get_attribute("d")
    assert [t.text_content() for t in static.locator("text.axis-label").all()] == [
        "pair (index, in A's execution order)",
        "max |diff| (log)",
    ]
    y_ticks = [t.text_content() or "" for t in static.locator("text.tick[text-anchor=end]").all()]
    assert y_ticks[-1] == "0" and all(t.startswith("1e") for t in y_ticks[:-1]) and len(y_ticks) >= 3
    assert static.locator("text.tick[text-anchor=middle]").first.text_content() == "0"


def test_sessions_list_counts_a_rerun_as_noise_links_first_divergences_and_folds_the_form(
    glance: Glance, page: Page
) -> None:
    """A session with a rerun of the reference lists its pairs once (the rerun's are their noise column, not pairs
    of their own); each first divergence links to its pair; the new-session form is folded once sessions exist."""
    s = glance.sessions
    fixed = loopback_http.get(f"{glance.server.url}/api/sessions/{s.fixed}/pairs", timeout=30).json()["pairs"]
    assert fixed and all(p["noise_max_abs_diff"] is not None for p in fixed if p["status"] == "pass")
    page.goto(glance.server.url + "/")
    row = page.locator("table.sessions tbody tr", has=page.get_by_role("link", name="trace-fixed", exact=True))
    assert row.locator("td.num").first.inner_text().strip() == str(len(fixed))  # 75 pairs, not 150
    trace = loopback_http.get(f"{glance.server.url}/api/sessions/{s.trace}/first-divergence", timeout=30).json()
    first = trace["first_divergence"]
    link = page.locator("table.sessions tbody tr", has=page.get_by_role("link", name="trace", exact=True)).locator(
        "td", has_text=first["name"]
    )
    assert link.locator("a").get_attribute("href") == f"/pairs/{first['pair_id']}"
    details = page.locator("details.new-session")
    assert details.get_attribute("open") is None and not page.get_by_label("Reference run").is_visible()
    details.locator("summary").click()
    assert page.get_by_label("Reference run").is_visible()
    shot(page, "glance-sessions")


def test_profiles_open_on_a_named_dimension_and_bin_each_group_by_its_own_width(glance: Glance, page: Page) -> None:
    """The profiles page opens at once on the named dimension most pairs have wider than 1 (tokens); by number, the
    rows are grouped by the dimension's name and size: a 64-wide hidden row keeps a column an index beside a
    1,000-wide vocab row that pools 8 a column and says so, in its header and in each cell's label."""
    page.goto(f"{glance.server.url}/sessions/{glance.sessions.named}/profiles")
    assert page.get_by_label("Aligned dimension").input_value() == "tokens"
    groups = page.locator("h2.profile-group")
    assert groups.all_inner_texts() == ["tokens (2 pairs, 8 indices)"]
    assert page.locator("#profiles a[aria-label]").count() == 16  # 2 pairs x 8 tokens, shown without pressing Show
    hot = page.get_by_label("ref.h.logits, index 3: max |diff| 0.5", exact=True)
    assert hot.count() == 1
    page.get_by_label("Aligned dimension").select_option("2")
    page.get_by_role("button", name="Show").click()
    page.wait_for_url("**dim=2")
    assert groups.all_inner_texts() == ["hidden (1 pairs, 64 indices)", "vocab (1 pairs, 1000 indices)"]
    binning = page.locator("p.binning").all_inner_texts()
    assert binning[0] == "hidden, 64 indices: a column each"
    assert binning[1].startswith("vocab, 1000 indices: each column the max of 8 (indices 0-7, 8-15, …)")
    hidden = page.locator(".profile-heatmap").nth(0).locator("a[aria-label]")
    vocab = page.locator(".profile-heatmap").nth(1).locator("a[aria-label]")
    assert hidden.count() == 64 and vocab.count() == 125
    assert hidden.nth(5).get_attribute("aria-label") == "ref.h.embed, index 5: max |diff| 0.001"
    spot = page.get_by_label("ref.h.logits, indices 496-503: max of 8: max |diff| 0.5", exact=True)
    assert spot.count() == 1
    spot.click()  # opens the pair on the worst of the 8: index 500
    page.wait_for_url("**/pairs/**")
    window = dict(parse_qsl(urlsplit(page.url).query))
    assert (window["index"], window["start"], window["count"], window["profile"]) == ("0,0,:", "468", "64", "2")
    page.go_back()
    shot(page, "glance-profiles-groups")


def test_the_model_as_a_graph_folds_highlights_the_paths_searches_and_opens_pairs(
    glance: Glance, browser: Browser
) -> None:
    """The traced session's modules as boxes and edges, linked from the session page, with no script at all (the
    page has none: the server renders the tree as nested <details>): folded but for the first two levels and the
    path to the first divergence (its module a target box, reached by the link at the top), coloured by error with
    the legend shown; a folded module opens on a click; a search opens the way to each match, the other modules
    folded behind "other modules here"; a box's name opens its pair."""
    s = glance.sessions
    first = loopback_http.get(f"{glance.server.url}/api/sessions/{s.trace}/first-divergence", timeout=30).json()
    first = first["first_divergence"]
    context = browser.new_context(viewport={"width": 1440, "height": 900}, java_script_enabled=False)
    page = context.new_page()
    page.goto(f"{glance.server.url}/sessions/{s.trace}")
    page.get_by_role("link", name="The model as a graph").click()
    page.wait_for_url(f"**/sessions/{s.trace}/graph")
    assert page.locator("script").count() == 0  # nothing here needs a script
    graph = page.locator("section.module-graph")
    modules = int(graph.get_attribute("data-modules") or "0")
    boxes = graph.locator(".gnode")
    assert boxes.count() == modules  # every module is in the page, most folded away
    visible = [b for b in boxes.all() if b.is_visible()]
    assert 3 <= len(visible) < modules
    target = graph.locator(".gnode.target.first")
    assert target.count() == 1 and target.is_visible()
    assert target.locator("a").get_attribute("href") == f"/pairs/{first['pair_id']}"  # its output: the first divergence
    assert target.locator("strong").inner_text() == "first divergence"
    assert target.evaluate("b => getComputedStyle(b).outlineStyle") == "solid"  # highlighted
    # the link at the top goes to it
    page.get_by_role("link", name=re.compile("^Go to the first divergence")).click()
    assert page.url.endswith("#first-divergence") and target.get_attribute("id") == "first-divergence"
    assert target.evaluate("b => { const r = b.getBoundingClientRect(); return r.top >= 0 && r.bottom <= innerHeight }")
    # the path from the root to it: each box above it is on the path, and open
    on_path = graph.locator(".gnode.on-path.first")
    assert on_path.count() >= 3 and all(b.is_visible() for b in on_path.all())
    above = target.evaluate(
        """b => { const found = []; let li = b.closest('li').parentElement.closest('li');
        while (li) { found.push(li.querySelector(':scope > .gnode').classList.contains('on-path'));
        li = li.parentElement.closest('li'); } return found; }"""
    )
    assert len(above) >= 2 and all(above)
    shades = {c for b in visible for c in (b.get_attribute("class") or "").split() if c.startswith("shade-e")}
    assert len(shades) >= 2  # coloured by error, more than one shade
    legend = page.locator("ul.graph-legend li").all_inner_texts()
    assert legend[0].strip() == "0" and legend[-1].strip() == "no error known" and len(legend) == 11
    # a folded module opens on a click on its summary, showing its children; a second click folds it again
    folded = graph.locator("li > details:not([open])").first.element_handle()
    summary = folded.query_selector(":scope > summary")
    inside = folded.query_selector_all(":scope > ul > li > .gnode")
    assert summary is not None and inside and not inside[0].is_visible()
    said = int(summary.inner_text().split()[0])
    summary.click()
    assert folded.get_attribute("open") is not None and inside[0].is_visible()
    assert 1 <= len(inside) <= said
    shot(page, "glance-graph")
    summary.click()
    assert folded.get_attribute("open") is None and not inside[0].is_visible()
    # search: every match shown, the modules above it open, the others folded behind "other modules here"
    page.locator("input[name=q]").fill("down_proj")
    page.get_by_role("button", name="Find").click()
    page.wait_for_url("**q=down_proj")
    matches = graph.locator(".gnode.matched")
    assert matches.count() >= 2 and all(m.is_visible() for m in matches.all())
    assert all(m.locator("a").inner_text() == "down_proj" for m in matches.all())
    assert page.get_by_role("status").inner_text().startswith(f"{matches.count()} of {modules} modules match")
    shot(page, "glance-graph-search")
    others = graph.locator("li.others > details")
    assert others.count() >= 2
    said = int(others.first.locator(":scope > summary").inner_text().split()[0])
    hidden = others.first.locator(":scope > ul > li > .gnode")
    assert hidden.count() == said and not hidden.first.is_visible()
    others.first.locator(":scope > summary").click()
    assert hidden.first.is_visible()
    link = matches.first.locator("a")
    href = link.get_attribute("href")
    link.click()
    page.wait_for_url(f"**{href}")
    context.close()
    # a session without module structure has no graph
    assert loopback_http.get(f"{glance.server.url}/sessions/{s.wide}/graph", timeout=30).status_code == 404
