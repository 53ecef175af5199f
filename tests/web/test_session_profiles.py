"""The session's error profiles (pairs × index of one aligned dimension): a difference planted from token 40 of
layer 2 on, growing in the layers after, through the API, the OpenAPI document and the heatmap page, whose
cells open the pair at their index."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
import torch
from playwright.sync_api import Browser
from tensor_debugger.settings import Settings
from tensor_debugger.web.app import create_app

from tests.support import loopback_http
from tests.support.browser import axe_context, axe_violations, shot
from tests.support.dumps import make_zip, seeded
from tests.support.servers import LiveServer, upload, wait_done

LAYERS, TOKENS, WIDTH, START = 4, 64, 16, 40


def planted(layer: int) -> float:
    """How far the candidate's hidden state is off from token START on: nothing before layer 2, then 10x more
    with each layer."""
    return 0.0 if layer < 2 else 10.0 ** (layer - 5)


CREATED: dict[str, int] = {}  # the session made on each shared server (the fixture is per test, as it is)


@pytest.fixture
def session(shared_server: LiveServer, tmp_path_factory: pytest.TempPathFactory) -> int:
    if shared_server.url in CREATED:
        return CREATED[shared_server.url]
    root = tmp_path_factory.mktemp("profiles")
    ref, cand = root / "ref", root / "cand"
    for side in (ref, cand):
        side.mkdir()
        torch.save(seeded((WIDTH,), 9), side / "0_norm.pth")  # 1-D: no token dimension
    for layer in range(LAYERS):
        hidden = seeded((1, TOKENS, WIDTH), layer)
        torch.save(hidden, ref / f"{layer}_hidden.pth")
        moved = hidden.clone()
        moved[0, START:] += planted(layer)
        torch.save(moved, cand / f"{layer}_hidden.pth")
    files = [("reference", make_zip(ref, root / "r.zip")), ("candidate", make_zip(cand, root / "c.zip"))]
    response = upload(shared_server, "profiles by token", files)
    assert response.status_code == 201, response.text
    session_id = int(response.json()["session"]["id"])
    wait_done(shared_server, session_id)
    CREATED[shared_server.url] = session_id
    return session_id


def test_api_rows_in_execution_order_with_the_planted_tokens(shared_server: LiveServer, session: int) -> None:
    api = f"{shared_server.url}/api/sessions/{session}/profiles"
    out: dict[str, Any] = loopback_http.get(api, params={"dim": 1}, headers=shared_server.auth, timeout=60).json()
    assert (out["dim"], out["size"]) == (1, TOKENS)
    assert [r["name"] for r in out["rows"]] == [f"{k}_hidden" for k in range(LAYERS)]
    for layer, row in enumerate(out["rows"]):
        off = [t for t, v in enumerate(row["max_abs_diff"]) if v > 0]
        assert off == (list(range(START, TOKENS)) if planted(layer) else []), layer
        if planted(layer):
            assert row["max_abs_diff"][START] == pytest.approx(planted(layer), rel=1e-3)
            assert row["mean_abs_diff"][TOKENS - 1] == pytest.approx(planted(layer), rel=1e-3)
        assert row["aligned_shape"] == [1, TOKENS, WIDTH]
    assert [(s["name"], s["reason"]) for s in out["skipped"]] == [("0_norm", "aligned shape [16] has no dimension 1")]
    again = loopback_http.get(api, params={"dim": 1}, headers=shared_server.auth, timeout=60).json()
    assert again == out  # each pair's profile kept with its result
    assert len(loopback_http.get(api, params={"dim": 3}, headers=shared_server.auth).json()["skipped"]) == LAYERS + 1
    refused = loopback_http.get(api, params={"dim": -1}, headers=shared_server.auth)
    assert refused.status_code == 400 and "dim" in refused.text
    assert (
        loopback_http.get(
            f"{shared_server.url}/api/sessions/999999/profiles?dim=1", headers=shared_server.auth
        ).status_code
        == 404
    )


def test_openapi_declares_the_rows(tmp_path: Path) -> None:
    document = create_app(Settings(data_dir=tmp_path / "data", demo=False)).openapi_schema.to_schema()
    ok = document["paths"]["/api/sessions/{session_id}/profiles"]["get"]["responses"]["200"]
    ref = ok["content"]["application/json"]["schema"]["$ref"].removeprefix("#/components/schemas/")
    fields = document["components"]["schemas"][ref]["properties"]
    assert set(fields) == {"dim", "name", "size", "rows", "skipped"}


@pytest.mark.browser
def test_heatmap_page_opens_the_pair_at_the_cell(shared_server: LiveServer, session: int, browser: Browser) -> None:
    context = axe_context(browser, {"width": 1440, "height": 900})
    page = context.new_page()
    page.goto(f"{shared_server.url}/sessions/{session}")
    page.get_by_role("link", name="Error profiles").click()
    page.get_by_label("Aligned dimension").select_option("1")
    page.get_by_role("button", name="Show").click()
    page.wait_for_url(re.compile(r"/profiles\?dim=1$"))
    assert page.locator("#profiles a[aria-label]").count() == LAYERS * TOKENS
    assert "1 pairs skipped" in page.locator("#profiles details summary").inner_text()
    dark = page.get_by_label("0_hidden, index 40: max |diff| 0", exact=True)
    hot = page.get_by_label("3_hidden, index 63: max |diff| 0.01", exact=True)
    assert dark.locator("rect").get_attribute("fill") == "#eeeeee"
    assert hot.locator("rect").get_attribute("fill") == "#fde725"  # the top of the scale
    assert axe_violations(page) == []
    shot(page, "session-profiles-1440")
    page.set_viewport_size({"width": 390, "height": 844})
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    page.get_by_label("2_hidden, index 40: max |diff| 0.001", exact=True).click()
    page.wait_for_url(re.compile(r"/pairs/\d+\?"))
    window = dict(parse_qsl(urlsplit(page.url).query))
    assert window["index"] == "0,40,:" and window["profile"] == "1"
    assert "the worst is index" in page.locator("#profile").inner_text()
    context.close()
