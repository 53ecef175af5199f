"""The pages in headless Chromium, as a user sees them; screenshots of the views a person checks go to
test-artifacts/."""

from __future__ import annotations

import re
import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from playwright.sync_api import Browser, Page, Response, expect
from tensor_debugger.demo.synthetic import Plant, write_dump

from tests.support import loopback_http
from tests.support.browser import ModulePage, open_new_session_form, shot, wait_until_compared
from tests.support.dumps import make_zip, seeded
from tests.support.polling import wait_until
from tests.support.servers import LiveServer, free_port
from tests.support.traces import MODEL_CLASS, WrittenTraces

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def module_page(browser: Browser) -> Iterator[ModulePage]:
    shared = ModulePage(browser, {"width": 1280, "height": 900})
    yield shared
    shared.close()


@pytest.fixture
def page(module_page: ModulePage) -> Page:
    return module_page.fresh()


@pytest.fixture(scope="module")
def module_page_without_scripts(browser: Browser) -> Iterator[ModulePage]:
    """A browser with JavaScript off: the pages must work before (and without) any script. Its waits for what a
    server does in the background (an ingest, which starts a child process: 30 s, Playwright's default, was too
    short on a loaded machine) end as soon as it shows; the longer limit only bounds a failure."""
    shared = ModulePage(browser, {"width": 1280, "height": 900}, java_script_enabled=False, timeout_ms=120_000)
    yield shared
    shared.close()


@pytest.fixture
def page_without_scripts(module_page_without_scripts: ModulePage) -> Page:
    return module_page_without_scripts.fresh()


@pytest.fixture(scope="module")
def demo_servers(demo_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, LiveServer]]:
    """Two servers of these tests' own, each on a copy of the computed demo (as `demo_server` gives one), started at
    once (a start is mostly imports, on one core each): one to filter, reorder and restart ("restart"), one to
    rename and delete the demo ("delete")."""
    servers: dict[str, LiveServer] = {}
    try:
        for use in ("restart", "delete"):
            root = tmp_path_factory.mktemp(f"demo-{use}")
            shutil.copytree(demo_data, root / "data")
            servers[use] = LiveServer(root / "data", free_port(), demo=True)
            servers[use].launch()
        for server in servers.values():
            wait_until(server.answers, what=f"the server on port {server.port} to answer", timeout=60, interval=0.02)
        yield servers
    finally:
        for server in servers.values():
            server.stop()


@contextmanager
def database_held(server: LiveServer) -> Iterator[sqlite3.Connection]:
    """The server's SQLite write lock, held by the test: ingests under way copy their arrays but cannot finish
    (their last transaction waits, up to the server's 30 s busy timeout), so pages show them under way for as
    long as the test looks. Reading is not blocked (WAL)."""
    connection = sqlite3.connect(server.data_dir / "metadata.sqlite3", isolation_level=None, timeout=30)
    try:
        connection.execute("BEGIN IMMEDIATE")
        yield connection
    finally:
        connection.execute("ROLLBACK")
        connection.close()


def add_big_tensor(reference: Path, candidate: Path, seed: int) -> None:
    """48 MiB, the same in both runs: enough bytes that an ingest is still copying when the test holds it."""
    torch.save(seeded((3072, 4096), seed), reference / "weights.pth")
    shutil.copy(reference / "weights.pth", candidate / "weights.pth")


def run_statuses(connection: sqlite3.Connection, session_id: int) -> list[str]:
    return [
        status
        for (status,) in connection.execute("select status from runs where session_id = ? order by id", (session_id,))
    ]


def session_of(answer: Response) -> int:
    """The id of the session an upload created, from the location it answered with (`/sessions/{id}`)."""
    return int(answer.headers["location"].rsplit("/", 1)[1])


def fill_new_session(
    page: Page, url: str | None, name: str, reference: Path, candidate: Path | list[Path] | None = None
) -> None:
    """The home page's new-session form filled in (the home page at `url` opened first, unless None), not sent."""
    if url is not None:
        page.goto(url + "/")
    open_new_session_form(page)
    page.get_by_label("Name", exact=True).fill(name)
    page.get_by_label("Reference run").set_input_files(str(reference))
    if candidate is not None:
        page.get_by_label("Candidate run").set_input_files(
            [str(c) for c in candidate] if isinstance(candidate, list) else str(candidate)
        )


def test_first_start_shows_the_demo_session(shared_demo_server: LiveServer, page: Page) -> None:
    page.goto(shared_demo_server.url + "/")
    link = page.get_by_role("link", name="demo: planted divergence at layer 2 post_attn")
    link.wait_for()
    shot(page, "sessions-demo")
    link.click()
    page.wait_for_url("**/sessions/*")
    wait_until_compared(page)
    banner = page.locator(".banner.fail")
    assert "First divergence: 2_post_attn (layer 2, stage post_attn)" in banner.inner_text()
    assert "[5, 17]" in banner.inner_text()
    assert pairs_in_groups(page) == 52
    # layers 0 and 1 pass: collapsed, their rows not even on the page; layers 2 and 3 fail: open
    assert page.locator("table.pairs tr.row").count() == 26
    assert page.get_by_role("link", name="Layer 0", exact=True).get_attribute("aria-expanded") == "false"
    row = page.locator("table.pairs tr", has_text="2_post_attn").first
    assert "FAIL" in row.inner_text().upper() and "[16, 32]" in row.inner_text()
    shot(page, "session-demo")
    assert "reference: reference/" in page.locator(".runs-header").inner_text()  # named for what was uploaded
    page.get_by_role("link", name="Candidate run: candidate/").click()
    expect(page.get_by_role("heading", name="Candidate run: candidate/")).to_be_visible()
    expect(page.locator("table.tensors tbody tr")).to_have_count(52)
    row = page.locator("table.tensors tr", has_text="2_post_attn").first
    assert "[16, 32]" in row.inner_text() and "float32" in row.inner_text()


def test_upload_through_the_form_without_scripts(
    shared_server: LiveServer, page_without_scripts: Page, tmp_path: Path
) -> None:
    page = page_without_scripts
    write_dump(tmp_path / "ref", layers=1, seed=2)
    write_dump(tmp_path / "cand", layers=1, seed=2, plant=Plant(0, "post_mlp", (1, 1), 1.0))
    add_big_tensor(tmp_path / "ref", tmp_path / "cand", 2)
    reference = make_zip(tmp_path / "ref", tmp_path / "reference.zip")
    candidate = make_zip(tmp_path / "cand", tmp_path / "candidate.zip")
    bad = tmp_path / "readme.txt"
    bad.write_text("not a tensor")
    fill_new_session(page, shared_server.url, "form upload ü", reference, [candidate, bad])
    with page.expect_response(lambda r: r.url.endswith("/sessions") and r.request.method == "POST") as answer:
        page.get_by_role("button", name="Upload and ingest").click()
    assert answer.value.status == 303  # the files are on disk; their ingest goes on in the background
    with database_held(shared_server) as held:
        assert run_statuses(held, session_of(answer.value)) == ["ingesting", "ingesting"], (
            "the ingest ended before the test could hold it"
        )
        page.wait_for_url("**/sessions/*")
        status = page.locator("section.ingest .progress")
        assert "Ingesting the uploaded files" in status.inner_text()
        status.get_by_role("link", name="refresh now").click()  # without scripts: a link (and a meta refresh)
        assert "ingesting" in page.locator(".ingest-runs").inner_text()
        assert page.locator("noscript").count() == 1
    wait_until_compared(page)
    assert "First divergence: 0_post_mlp" in page.locator(".banner.fail").inner_text()
    expect(page.get_by_role("heading", name="form upload ü")).to_be_visible()
    assert page.locator("section.ingest").count() == 0
    assert "1 ignored (no tensor in it)" in page.locator("section.runs").inner_text()
    assert "readme.txt: not a tensor file or archive" in page.locator("section.runs ul.problems").inner_text()
    page.get_by_role("link", name="Candidate run: candidate.zip and 1 more file").click()
    expect(page.locator("table.tensors tbody tr")).to_have_count(14)  # the run's page, once it has loaded
    assert "readme.txt: not a tensor file or archive" in page.locator("ul.problems").inner_text()
    page.goto(shared_server.url + "/?q=FORM")
    expect(page.get_by_role("link", name="form upload ü")).to_be_visible()


def test_form_errors_are_shown_in_words(shared_server: LiveServer, page_without_scripts: Page, tmp_path: Path) -> None:
    page = page_without_scripts
    bad = tmp_path / "weights.pth"
    bad.write_bytes(b"\0" * 64)
    fill_new_session(page, shared_server.url, "broken", bad)
    page.get_by_role("button", name="Upload and ingest").click()
    page.wait_for_url("**/sessions/*")
    failure = page.locator("section.failed-run")
    failure.wait_for()  # the page refreshes itself until the ingest has failed
    assert "The reference run “reference” could not be ingested" in failure.inner_text()
    assert "No tensors found in weights.pth" in failure.inner_text()
    assert "weights.pth: not a readable PyTorch file" in failure.locator("ul.problems").inner_text()
    assert page.locator("section.ingest").count() == 0
    shot(page, "form-error")
    # what is wrong before any ingest begins is said on the form itself (a name taken is not: it gets " (2)")
    fill_new_session(page, shared_server.url, "broken\u0007", bad)
    page.get_by_role("button", name="Upload and ingest").click()
    assert "session name must be 1 to 200 printable characters" in page.get_by_role("alert").inner_text()


def test_inspector_jumps_to_the_planted_difference(shared_demo_server: LiveServer, page: Page) -> None:
    page.goto(shared_demo_server.url + "/")
    page.get_by_role("link", name="demo: planted divergence at layer 2 post_attn").click()
    page.locator(".banner.fail").wait_for(timeout=60_000)
    page.locator(".banner.fail").get_by_role("link", name="2_post_attn").click()
    page.wait_for_url("**/pairs/*")
    expect(page.get_by_role("heading", name="2_post_attn")).to_be_visible()
    assert "Aligned [5, 17]" in page.locator("section.card", has_text="Layouts").inner_text()
    page.locator("form.window input[name=index]").fill("0,:")
    page.locator("form.window input[name=start]").fill("0")
    page.locator("form.window input[name=count]").fill("8")
    page.get_by_role("button", name="Show").click()
    page.wait_for_function("() => document.querySelector('.caption').textContent.includes('Window [0, 0:8]')")
    assert "index=0%2C%3A" in page.url and "count=8" in page.url
    page.get_by_role("link", name="Jump to max diff").click()
    page.wait_for_function("() => document.querySelector('.caption').textContent.includes('[5, ')")
    biggest = page.locator("figure.grid", has_text="Difference").locator("td.max")
    title = biggest.get_attribute("title") or ""
    assert title.startswith("[5, 17] value 0.3") and "outside tolerance" in title
    assert "index=5%2C%3A" in page.url and "start=13" in page.url  # the window is in the URL
    shot(page, "pair-jump-to-max")
    page.locator("body").press("ArrowDown")  # the next row
    page.wait_for_function("() => document.querySelector('.caption').textContent.includes('[6, ')")
    assert "index=6%2C%3A" in page.url
    page.go_back()
    page.wait_for_function("() => document.querySelector('.caption').textContent.includes('[5, ')")
    heatmap = page.locator("figure.heatmap a", has_text="As SVG").get_attribute("href")  # the map as a file
    assert heatmap is not None
    svg = loopback_http.get(shared_demo_server.url + heatmap.replace("&amp;", "&")).text
    assert svg.count("<rect") == 16 * 32 + 21  # a cell per element, and the colour scale's steps
    assert "rows 5-5, cols 17-17: largest difference (candidate − reference) 0.3" in svg
    page.reload()  # a link shows the same values
    title = page.locator("figure.grid", has_text="Difference").locator("td.max").get_attribute("title") or ""
    assert title.startswith("[5, 17]")


def row_names(page: Page) -> list[str]:
    return [
        page.locator("table.pairs tr.row").nth(i).locator("td a").first.inner_text()
        for i in range(page.locator("table.pairs tr.row").count())
    ]


def pairs_in_groups(page: Page) -> int:
    """The pairs of every group of the table, as their headers count them (collapsed groups' rows are not loaded)."""
    return sum(int(text.split()[0]) for text in page.locator("tr.group-head .count").all_inner_texts())


def test_filter_reorder_tolerances_and_restart(demo_servers: dict[str, LiveServer], page: Page) -> None:
    demo_server = demo_servers["restart"]
    page.goto(demo_server.url + "/sessions/1")
    wait_until_compared(page)
    assert page.locator("figure.chart line.first").count() == 1  # the first divergence, marked
    page.get_by_label("Show").select_option("fail")
    page.get_by_role("button", name="Apply", exact=True).click()
    page.wait_for_url("**verdict=fail**")
    assert page.locator("table.pairs tr.row").count() == 15
    assert all(text.strip().upper() == "FAIL" for text in page.locator("table.pairs td.verdict").all_inner_texts())
    page.get_by_role("button", name="Collapse all").click()
    assert not page.locator("tbody.group").first.evaluate("g => g.classList.contains('open')")
    page.get_by_role("button", name="Expand all").click()
    # reorder: ungrouped, in execution order; drag the third row to the top, then move it down with the keyboard
    page.goto(demo_server.url + "/sessions/1?group=none")
    before = row_names(page)
    page.locator("table.pairs tr.row").nth(2).drag_to(
        page.locator("table.pairs tr.row").nth(0), target_position={"x": 20, "y": 2}
    )
    page.wait_for_function("() => document.querySelector('table.pairs')?.dataset.saved === 'yes'")
    page.reload()
    after = row_names(page)
    assert after[0] == before[2] and after[1:3] == before[0:2]
    page.get_by_role("button", name=f"Move {before[0]} up").focus()
    page.evaluate("window.sameDocument = true; document.querySelector('table.pairs').dataset.saved = ''")
    page.keyboard.press("Enter")  # moved in place and saved, no reload
    page.wait_for_function("() => document.querySelector('table.pairs')?.dataset.saved === 'yes'")
    assert page.evaluate("window.sameDocument") is True
    moved = row_names(page)
    page.reload()
    assert row_names(page) == moved
    assert moved.index(before[0]) == after.index(before[0]) - 1
    # tolerances: loose enough and every verdict passes
    page.get_by_label("atol").fill("1")
    page.get_by_role("button", name="Apply tolerances").click()
    page.locator(".banner.pass").wait_for(timeout=60_000)
    assert "No divergence" in page.locator(".banner.pass").inner_text()
    with page.expect_download() as download:
        page.get_by_role("link", name="Download CSV").click()
    csv_text = Path(download.value.path()).read_text()
    assert csv_text.splitlines()[0].startswith("position,name,layer,stage,status")
    assert len(csv_text.splitlines()) == 53 and csv_text.splitlines()[1].split(",")[1] == moved[0]
    # restart: the session, its order and its tolerances are as they were
    demo_server.stop()
    demo_server.start()
    page.goto(demo_server.url + "/sessions/1?group=none")
    page.locator(".banner.pass").wait_for(timeout=60_000)
    assert row_names(page) == moved
    assert page.get_by_label("atol").input_value() == "1.0"


def test_new_session_with_progress_bars_and_errors_next_to_files(
    shared_server: LiveServer, page: Page, tmp_path: Path
) -> None:
    write_dump(tmp_path / "ref", layers=2, seed=5)
    write_dump(tmp_path / "cand", layers=2, seed=5, plant=Plant(1, "key", (0, 1, 3, 2), 0.2))
    reference = make_zip(tmp_path / "ref", tmp_path / "reference.zip")
    candidate = make_zip(tmp_path / "cand", tmp_path / "candidate.zip")
    fill_new_session(page, shared_server.url, "dropped", reference, candidate)
    assert page.locator(".dropzone li").count() == 2
    page.get_by_role("button", name="Upload and ingest").click()
    page.wait_for_url("**/sessions/*")
    page.locator(".banner.fail").wait_for(timeout=60_000)
    assert "First divergence: 1_key (layer 1, stage key)" in page.locator(".banner.fail").inner_text()
    # a file refused before its ingest begins (a name that cannot be one) gets the reason on the form
    fill_new_session(page, shared_server.url, "dropped\u0007", reference)
    page.get_by_role("button", name="Upload and ingest").click()
    page.locator("form.new-session .status", has_text="printable characters").wait_for()
    assert page.locator(".dropzone progress").evaluate("p => p.value === p.max")
    # a file only its ingest finds corrupt: the session page names it with the reason, next to its run
    bad = tmp_path / "weights.pth"
    bad.write_bytes(b"\0" * 32)
    fill_new_session(page, None, "bad one", bad)
    page.get_by_role("button", name="Upload and ingest").click()
    page.wait_for_url("**/sessions/*")
    failure = page.locator("section.failed-run")
    failure.wait_for(timeout=60_000)
    assert "The reference run “reference” could not be ingested" in failure.inner_text()
    assert "weights.pth: not a readable PyTorch file" in failure.locator("ul.problems").inner_text()


def test_session_page_follows_the_ingest_live_then_shows_the_results(
    shared_server: LiveServer, page: Page, tmp_path: Path
) -> None:
    """The upload answers once its bytes are on disk; the session page shows each run's ingest with a bar and
    "ingesting: X of Y MB (Z%)", then the comparisons, then the results, all without a reload."""
    write_dump(tmp_path / "ref", layers=2, seed=6)
    write_dump(tmp_path / "cand", layers=2, seed=6, plant=Plant(0, "query", (0, 2, 5, 3), 0.5))
    add_big_tensor(tmp_path / "ref", tmp_path / "cand", 6)
    reference = make_zip(tmp_path / "ref", tmp_path / "reference.zip")
    candidate = make_zip(tmp_path / "cand", tmp_path / "candidate.zip")
    fill_new_session(page, shared_server.url, "live", reference, candidate)
    with page.expect_response(lambda r: r.url.endswith("/api/sessions?wait=false")) as answer:
        page.get_by_role("button", name="Upload and ingest").click()
    assert answer.value.status == 202
    with database_held(shared_server) as held:
        assert run_statuses(held, session_of(answer.value)) == ["ingesting", "ingesting"], (
            "the ingest ended before the test could hold it"
        )
        page.wait_for_url("**/sessions/*")
        page.evaluate("window.sameDocument = true")  # gone if anything reloads the page
        bars = page.locator(".ingest-runs progress")
        assert bars.count() == 2
        page.wait_for_function(
            """() => [...document.querySelectorAll('.ingest-runs li')].every(li =>
            /ingesting: [0-9.]+ of 5[0-9.]+ MB \\([0-9]+%\\)/.test(li.querySelector('.words').textContent)
            && li.querySelector('progress').max > 50e6)""",
            timeout=60_000,
        )
        words = page.locator(".ingest-runs li").first.locator(".words").inner_text()
        assert re.fullmatch(r"ingesting: [0-9.]+ of 5[0-9.]+ MB \([0-9]+%\)", words), words
        shot(page, "session-ingesting")
    page.locator("#live").wait_for(state="detached", timeout=60_000)  # on the page while anything is under way
    assert "First divergence: 0_query (layer 0, stage query)" in page.locator(".banner.fail").inner_text()
    assert page.locator("section.ingest").count() == 0 and page.locator(".progress").count() == 0
    assert pairs_in_groups(page) == 27
    assert page.evaluate("window.sameDocument") is True
    page.get_by_role("button", name="Collapse all").click()  # the swapped-in page's controls work
    assert not page.locator("tbody.group").first.evaluate("g => g.classList.contains('open')")


def test_sessions_list_rename_and_delete_with_confirmation(demo_servers: dict[str, LiveServer], page: Page) -> None:
    demo_server = demo_servers["delete"]
    page.goto(demo_server.url + "/sessions/1")
    wait_until_compared(page)
    page.goto(demo_server.url + "/")
    row = page.locator("table.sessions tbody tr").first
    assert "52" in row.inner_text() and "15 failing" in row.inner_text().lower() and "2_post_attn" in row.inner_text()
    row.locator("summary", has_text="Rename").click()
    row.get_by_label("New name").fill("renamed demo")
    row.get_by_role("button", name="Rename").click()
    page.wait_for_url(demo_server.url + "/")
    expect(page.get_by_role("link", name="renamed demo")).to_be_visible()
    row = page.locator("table.sessions tbody tr").first
    row.locator("summary", has_text="Delete…").click()
    row.get_by_role("button", name="Delete for good").click()  # refused by the browser: the box is unticked
    expect(page.get_by_role("link", name="renamed demo")).to_be_visible()
    row.get_by_label("Delete “renamed demo” with its runs and arrays").check()
    shot(page, "sessions-delete-confirm")
    row.get_by_role("button", name="Delete for good").click()
    page.wait_for_url(demo_server.url + "/")
    expect(page.get_by_text("No sessions yet")).to_be_visible()
    assert not (demo_server.data_dir / "arrays" / "runs" / "1").exists()


def test_manual_mode_shows_each_runs_own_layout(
    shared_server: LiveServer, page_without_scripts: Page, tmp_path: Path
) -> None:
    import torch

    full = torch.arange(2 * 3 * 4, dtype=torch.float32).reshape(2, 3, 4)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    torch.save(full, tmp_path / "a" / "0_query.pth")
    torch.save(full.permute(1, 0, 2).unsqueeze(0).contiguous(), tmp_path / "b" / "0_query.pth")  # [1, 3, 2, 4]
    reference = make_zip(tmp_path / "a", tmp_path / "a.zip")
    candidate = make_zip(tmp_path / "b", tmp_path / "b.zip")
    response = loopback_http.post(
        shared_server.url + "/api/sessions",
        data={"name": "manual"},
        files=[("reference", ("a.zip", reference.read_bytes())), ("candidate", ("b.zip", candidate.read_bytes()))],
        timeout=60,
    )
    session_id = response.json()["session"]["id"]
    pair_id = loopback_http.get(f"{shared_server.url}/api/sessions/{session_id}/pairs").json()["pairs"][0]["id"]
    page = page_without_scripts
    page.goto(f"{shared_server.url}/pairs/{pair_id}")
    page.get_by_role("link", name="Open manual mode").click()
    page.locator("input[name=a_index]").fill("1,2,:")  # the reference's own [2, 3, 4]
    page.locator("input[name=a_count]").fill("4")
    page.locator("input[name=b_index]").fill("0,2,1,:")
    page.locator("input[name=b_count]").fill("4")
    page.get_by_role("button", name="Show both").click()
    grids = page.locator("section.manual figure.grid")
    assert "0_query [2, 3, 4] float32" in grids.nth(0).inner_text()
    assert "0_query [1, 3, 2, 4] float32" in grids.nth(1).inner_text()
    ref_values = grids.nth(0).locator("td").all_inner_texts()
    cand_values = grids.nth(1).locator("td").all_inner_texts()
    assert ref_values == cand_values == ["20", "21", "22", "23"]  # the same elements, each in its own layout
    shot(page, "pair-manual-mode")


def test_module_tree_and_culprit_of_a_traced_session(
    shared_server: LiveServer, page: Page, hf_traces: WrittenTraces
) -> None:
    reference, candidate = hf_traces["eager"], hf_traces["perturbed"]
    files = [
        (label, (p.name, p.read_bytes()))
        for label, folder in (("reference", reference), ("candidate", candidate))
        for p in sorted(folder.iterdir())
    ]
    created = loopback_http.post(shared_server.url + "/api/sessions", data={"name": "traced"}, files=files, timeout=120)
    assert created.status_code == 201, created.text
    page.goto(f"{shared_server.url}/sessions/{created.json()['session']['id']}")
    wait_until_compared(page)
    culprit = f"{MODEL_CLASS}.model.layers.1.mlp.down_proj"
    banner = page.locator("#culprit")
    expect(banner).to_contain_text(f"Introduced the most error: {culprit}")
    expect(page.locator(".banner.fail")).to_contain_text(f"First divergence: {culprit}_outputs")
    node = page.locator(f'details.module[data-module="{culprit}"]')
    expect(node).to_have_class(re.compile(r"\bculprit\b"))
    expect(node).to_have_class(re.compile(r"\bverdict-fail\b"))
    expect(node.locator("> summary")).to_contain_text("introduced the most error")
    assert node.evaluate("n => n.open") and node.is_visible()  # failing subtrees start open
    passing = page.locator(f'details.module[data-module="{MODEL_CLASS}.model.layers.0"]')
    expect(passing).to_have_class(re.compile(r"\bverdict-pass\b"))
    assert not passing.evaluate("n => n.open")
    passing.locator("> summary").click()  # collapsible: opens on a click
    assert passing.evaluate("n => n.open")
    expect(passing.locator(f'details.module[data-module="{MODEL_CLASS}.model.layers.0.mlp"]')).to_be_visible()
    shot(page, "module-tree")
    banner.get_by_role("link").click()
    expect(page.locator("h1")).to_contain_text(f"{culprit}_outputs")
    expect(page.locator(".meta")).to_contain_text(f"Module {culprit}, outputs")
