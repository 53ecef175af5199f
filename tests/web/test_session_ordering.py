"""The session page's ordering, in headless Chromium: sorting by a column sorts the whole group before it is cut
into pages (page 1 holds the largest, and the group's header agrees with its first row), and the "worst pairs"
list above the groups shows the ten compared pairs with the largest max |diff| and the ten with the lowest cosine,
whatever the table is sorted, filtered or paged by.

The session (built in this process through the services, as `compare` does, while the server starts): layer 0
holds 150 failing pairs, more than a page of 100. Its first divergence in execution order, `layers.0.t000`, has
the smallest difference of them all (0.0039), so sorted by largest difference it is the group's last row: the
group once opened on the page holding it, showing 0.0039 on top under a header that said 0.158. Ten of the layer's
tensors differ everywhere a little (a low cosine, a middling max |diff|), the others at one element each; layer 1's
pairs are identical, layer 2's pair cannot be compared (the shapes differ), and layer 3's candidate has a NaN.
The expected rankings are computed here with torch, from the tensors written."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from playwright.sync_api import Browser, Page, expect
from tensor_debugger.cli.compare_output import compare_request
from tensor_debugger.compare.pipeline import compare_runs
from tensor_debugger.compare.reports.compare_report import to_json
from tensor_debugger.services import open_services
from tensor_debugger.settings import Settings

from tests.support import loopback_http
from tests.support.browser import ModulePage, shot
from tests.support.built_once import built_once, copy_of
from tests.support.dumps import seeded
from tests.support.servers import LiveServer, free_port, wait_done

pytestmark = pytest.mark.browser

SPREAD = {7 + 15 * n for n in range(10)}  # layer 0's tensors that differ everywhere (a low cosine)


@dataclass(frozen=True)
class Ranked:
    name: str
    max_abs_diff: float
    cosine: float


@dataclass(frozen=True)
class Ordering:
    server: LiveServer
    session: int
    ranked: list[Ranked]  # every pair that can be compared, as torch computes it
    lone: int  # a session whose only pair cannot be compared


def write_runs(root: Path) -> list[Ranked]:
    """The reference and candidate .pth files, and each comparable pair's max |diff| and cosine (float64)."""
    reference: dict[str, torch.Tensor] = {}
    candidate: dict[str, torch.Tensor] = {}
    for k in range(150):
        name = f"layers.0.t{k:03d}"
        a = seeded((8, 16), 100 + k)
        b = a.clone()
        if k == 0:
            b[0, 0] += 0.0039  # the first divergence, and the smallest difference of the layer
        elif k in SPREAD:
            b += 0.05 * seeded((8, 16), 1000 + k)
        else:
            b[k % 8, k % 16] += 0.01 + 0.001 * ((k * 37) % 149)  # all different, in no order along the layer
        reference[name], candidate[name] = a, b
    for k in range(5):
        reference[f"layers.1.same{k}"] = candidate[f"layers.1.same{k}"] = seeded((4, 4), 300 + k)
    reference["layers.2.odd"], candidate["layers.2.odd"] = seeded((8, 16), 400), seeded((3, 5), 401)
    nan = seeded((4, 4), 500)
    reference["layers.3.nan"], candidate["layers.3.nan"] = nan, nan.clone()
    candidate["layers.3.nan"][1, 1] = math.nan
    torch.save(reference, root / "ref.pth")
    torch.save(candidate, root / "cand.pth")
    ranked = []
    for name, a in reference.items():
        b = candidate[name]
        if a.shape != b.shape:
            continue
        x, y = a.double().flatten(), b.double().flatten()
        cosine = float(torch.dot(x, y) / (x.norm() * y.norm()))
        ranked.append(Ranked(f"ref.{name}", float((y - x).abs().max()), cosine))
    return ranked


def build_ordering(root: Path) -> dict[str, Any]:
    """The two sessions in `root / "data"`, built in this process through the services (as `compare` does), and
    the expected ranking of the first's comparable pairs."""
    ranked = write_runs(root)
    (root / "data").mkdir()
    services = open_services(Settings(data_dir=root / "data", demo=False))
    try:
        request = compare_request(root / "ref.pth", root / "cand.pth", "ordering", None, None)
        session = int(
            to_json(compare_runs(services.ingestor, services.context, services.compute, request, "").payload)[
                "session"
            ]["id"]
        )
        torch.save({"x": seeded((8, 16), 1)}, root / "lone-a.pth")
        torch.save({"x": seeded((3, 5), 2)}, root / "lone-b.pth")
        request = compare_request(root / "lone-a.pth", root / "lone-b.pth", "nothing compared", None, None)
        lone = int(
            to_json(compare_runs(services.ingestor, services.context, services.compute, request, "").payload)[
                "session"
            ]["id"]
        )
    finally:
        services.close()
    return {"session": session, "lone": lone, "ranked": [asdict(r) for r in ranked]}  # NaN kept: JSON's NaN


@pytest.fixture(scope="module")
def ordering(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ordering]:
    """A server of the module's own on a copy of the sessions, built once for the run
    (tests/support/built_once.py)."""
    built, found = built_once(tmp_path_factory, "ordering", build_ordering)
    data = copy_of(built / "data", tmp_path_factory.mktemp("ordering") / "data")
    server = LiveServer(data, free_port()).start()
    try:
        wait_done(server, found["session"])
        yield Ordering(server, found["session"], [Ranked(**r) for r in found["ranked"]], found["lone"])
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


def worst_by_diff(ranked: list[Ranked]) -> list[str]:
    """NaN first (the worst value there is), then largest first."""
    return [r.name for r in sorted(ranked, key=lambda r: -math.inf if math.isnan(r.max_abs_diff) else -r.max_abs_diff)]


def worst_by_cosine(ranked: list[Ranked]) -> list[str]:
    return [r.name for r in sorted(ranked, key=lambda r: -math.inf if math.isnan(r.cosine) else r.cosine)]


def numbers(texts: list[str]) -> list[float]:
    return [float(t.replace("NaN", "nan")) for t in texts]


def test_the_expected_rankings_have_no_ties(ordering: Ordering) -> None:
    """The rankings below are exact only if no two of their first 11 values are as close as the page's rounding."""
    for key in ("max_abs_diff", "cosine"):
        values = sorted((getattr(r, key) for r in ordering.ranked if not math.isnan(getattr(r, key))), reverse=True)
        if key == "cosine":
            values.reverse()
        assert all(abs(x - y) > 1e-6 * max(abs(x), 1e-3) for x, y in zip(values[:11], values[1:11], strict=False))


def test_sorting_by_largest_difference_starts_on_page_1_with_the_largest(ordering: Ordering, page: Page) -> None:
    url = f"{ordering.server.url}/sessions/{ordering.session}"
    page.goto(url)
    page.get_by_label("Sort by").select_option("diff")
    page.get_by_role("button", name="Apply", exact=True).click()
    page.wait_for_url(re.compile(r"sort=diff"))
    group = page.locator("#group-Layer-0")
    expect(group).to_have_attribute("data-page", "0")
    header = group.locator("tr.group-head td.num").first.inner_text()
    rows = group.locator("tr.row")
    expect(rows).to_have_count(100)
    first_page = numbers(rows.locator("td:nth-child(6)").all_inner_texts())
    layer_0 = [r for r in ordering.ranked if r.name.startswith("ref.layers.0.")]
    largest = max(r.max_abs_diff for r in layer_0)
    assert header == rows.first.locator("td.num").first.inner_text()  # the header's largest is the first row's
    assert first_page[0] == pytest.approx(largest, rel=1e-3)
    assert first_page == sorted(first_page, reverse=True)
    assert rows.first.locator("td.name a").inner_text() == worst_by_diff(layer_0)[0]
    shot(page, "session-sorted-by-difference")
    # the next page, fetched in place, goes on downwards from where page 1 ended, down to the first divergence
    group.locator("tr.pager").get_by_role("link", name="next 100 ›").click()
    page.locator("#group-Layer-0 tr.pager", has_text="Pairs 101–150 of 150").wait_for()
    second_page = numbers(page.locator("#group-Layer-0 tr.row td:nth-child(6)").all_inner_texts())
    assert len(second_page) == 50 and second_page == sorted(second_page, reverse=True)
    assert second_page[0] <= first_page[-1]
    assert page.locator("#group-Layer-0 tr.row").last.locator("td.name a").inner_text() == "ref.layers.0.t000"
    assert second_page[-1] == pytest.approx(0.0039, rel=1e-3)


def test_sorting_without_scripts_is_the_same_on_the_server(ordering: Ordering, browser: Browser) -> None:
    context = browser.new_context(viewport={"width": 1440, "height": 900}, java_script_enabled=False)
    page = context.new_page()
    url = f"{ordering.server.url}/sessions/{ordering.session}"
    for sort, column, expected in (("diff", 6, worst_by_diff), ("cosine", 10, worst_by_cosine)):
        page.goto(f"{url}?sort={sort}")
        group = page.locator("#group-Layer-0")
        layer_0 = [r for r in ordering.ranked if r.name.startswith("ref.layers.0.")]
        names = group.locator("tr.row td.name a").all_inner_texts()
        assert names == expected(layer_0)[:100], sort
        head = group.locator(f"tr.group-head td:nth-child({column - 4})").inner_text()
        assert head == group.locator(f"tr.row td:nth-child({column})").first.inner_text(), sort
        # the next page's link (a plain link) shows the rest, still in order
        group.locator("tr.pager").get_by_role("link", name="next 100 ›").click()
        page.wait_for_url(re.compile(r"page=1"))
        rest = page.locator("#group-Layer-0 tr.row td.name a").all_inner_texts()
        assert rest == expected(layer_0)[100:], sort
    # a pair that cannot be compared sorts last, after every compared pair, not first
    page.goto(f"{url}?sort=diff&group=none")
    assert page.locator("tr.row td.name a").first.inner_text() == "ref.layers.3.nan"
    page.goto(f"{url}?sort=diff&group=none&open=all&page=1")
    assert page.locator("tr.row td.name a").last.inner_text() == "ref.layers.2.odd"
    context.close()


def worst_table(page: Page, caption: str) -> list[str]:
    table = page.locator("section.worst-pairs table", has=page.locator("caption", has_text=caption))
    return table.locator("tbody tr td.name a").all_inner_texts()


def test_the_worst_pairs_are_listed_above_the_groups_whatever_the_view(ordering: Ordering, page: Page) -> None:
    url = f"{ordering.server.url}/sessions/{ordering.session}"
    by_diff, by_cosine = worst_by_diff(ordering.ranked)[:10], worst_by_cosine(ordering.ranked)[:10]
    assert by_cosine[0] == by_diff[0] == "ref.layers.3.nan"
    assert set(by_cosine[1:]) < {f"ref.layers.0.t{k:03d}" for k in SPREAD} and by_diff != by_cosine
    for query in ("", "?sort=name", "?verdict=pass&q=same", "?group=none&open=all&page=1&sort=numel"):
        page.goto(url + query)
        assert worst_table(page, "Largest max |diff|") == by_diff, query
        assert worst_table(page, "Lowest cosine") == by_cosine, query
    page.goto(url)
    section = page.locator("section.worst-pairs")
    # above the groups, with a heading; each table is captioned and its columns have headers
    above = (
        "document.querySelector('section.worst-pairs').compareDocumentPosition(document.querySelector('table.pairs'))"
    )
    assert page.evaluate(above) & 4  # DOCUMENT_POSITION_FOLLOWING
    expect(section.get_by_role("heading", name="Worst pairs")).to_be_visible()
    assert section.locator("caption").count() == 2
    assert section.locator("thead th[scope=col]").count() == section.locator("thead th").count() > 0
    # values as the table shows them: the cosine that reads 1 says how far from 1 it is
    cosine_table = section.locator("table", has=page.locator("caption", has_text="Lowest cosine"))
    cosines = cosine_table.locator("tbody td.cosine").all_inner_texts()
    assert cosines[0] == "NaN" and all(c.startswith("1 − ") or float(c) < 1 for c in cosines[1:])
    shot(page, "session-worst-pairs")
    # each entry links to its pair page, and to its row: the group opened at the page that holds it
    lowest = cosine_table.locator("tbody tr").nth(1)
    name = lowest.locator("td.name a").inner_text()
    pairs = loopback_http.get(f"{url.replace('/sessions/', '/api/sessions/')}/pairs", timeout=30).json()
    pair_id = next(p["id"] for p in pairs["pairs"] if p["name"] == name)
    assert lowest.locator("td.name a").get_attribute("href") == f"/pairs/{pair_id}"
    later = [n for n in by_cosine if n.startswith("ref.layers.0.") and int(n[-3:]) >= 100][0]  # exec. order's page 2
    cosine_table.locator("tbody tr", has=page.get_by_role("link", name=later, exact=True)).get_by_role(
        "link", name=re.compile("^row of .* in the table$")
    ).click()
    page.wait_for_url(re.compile(r"open=Layer\+0&page=1#pair-\d+$"))
    row = page.locator(f"tr.row:has(td.name a[aria-label='{later}'])")
    expect(row).to_be_visible()
    assert row.get_attribute("id") == page.url.rsplit("#", 1)[1]
    # the same list, typed, in the pairs' JSON
    worst = pairs["worst_pairs"]
    assert [w["name"] for w in worst["by_max_abs_diff"]] == by_diff
    assert [w["name"] for w in worst["by_cosine"]] == by_cosine
    assert worst["by_max_abs_diff"][0]["max_abs_diff"] == "nan"


def test_a_session_with_nothing_compared_has_no_worst_pairs(ordering: Ordering, page: Page) -> None:
    """A session whose only pair cannot be compared (its shapes differ): no list, and none in the JSON."""
    report = wait_done(ordering.server, ordering.lone)
    assert [p["status"] for p in report["pairs"]] == ["incomparable"]
    assert report["worst_pairs"] == {"by_max_abs_diff": [], "by_cosine": []}
    page.goto(f"{ordering.server.url}/sessions/{ordering.lone}")
    expect(page.locator("table.pairs tr.row")).to_have_count(1)
    assert page.locator("section.worst-pairs").count() == 0
