"""The module tree of a traced session in the browser: a block that records no output takes its colour from its
worst child, the whole model is never the culprit while a module inside it can be, and a run whose error grows
evenly (fp32 against bf16) names no culprit and says so."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.support import loopback_http
from tests.support.browser import ModulePage, wait_until_compared
from tests.support.servers import LiveServer
from tests.support.traces import MODEL_CLASS, WrittenTraces

pytestmark = pytest.mark.browser

DOWN_PROJ = f"{MODEL_CLASS}.model.layers.1.mlp.down_proj"


@pytest.fixture(scope="module")
def module_page(browser: Browser) -> Iterator[ModulePage]:
    shared = ModulePage(browser, {"width": 1280, "height": 900})
    yield shared
    shared.close()


@pytest.fixture
def page(module_page: ModulePage) -> Page:
    return module_page.fresh()


def open_session(server: LiveServer, page: Page, name: str, reference: Path, candidate: Path) -> None:
    files = [
        (label, (p.name, p.read_bytes()))
        for label, folder in (("reference", reference), ("candidate", candidate))
        for p in sorted(folder.iterdir())
    ]
    created = loopback_http.post(server.url + "/api/sessions", data={"name": name}, files=files, timeout=120)
    assert created.status_code == 201, created.text
    page.goto(f"{server.url}/sessions/{created.json()['session']['id']}")
    wait_until_compared(page)


def test_blocks_take_their_worst_childs_colour_and_the_root_is_no_culprit(
    shared_server: LiveServer, page: Page, hf_traces: WrittenTraces
) -> None:
    open_session(shared_server, page, "worst child", hf_traces["eager"], hf_traces["perturbed"])
    expect(page.locator("#culprit")).to_contain_text(f"Introduced the most error: {DOWN_PROJ}")
    # the MLP block and its decoder layer record only inputs, which pass: each takes its failing down_proj's colour
    for path in (f"{MODEL_CLASS}.model.layers.1.mlp", f"{MODEL_CLASS}.model.layers.1", f"{MODEL_CLASS}.model"):
        node = page.locator(f'details.module[data-module="{path}"]')
        expect(node).to_have_class(re.compile(r"\bverdict-fail\b"))
        expect(node.locator("> summary .badge")).to_have_text("fail")
        expect(node).not_to_have_class(re.compile(r"\bculprit\b"))
    expect(page.locator(f'details.module[data-module="{MODEL_CLASS}.model.layers.0"]')).to_have_class(
        re.compile(r"\bverdict-pass\b")
    )
    root = page.locator(f'details.module[data-module="{MODEL_CLASS}"]')
    expect(root).not_to_have_class(re.compile(r"\bculprit\b"))
    expect(root.locator("> summary")).not_to_contain_text("introduced the most error")
    expect(page.locator("details.module.culprit")).to_have_count(1)
    expect(page.locator("details.module.culprit")).to_have_attribute("data-module", DOWN_PROJ)


def test_even_drift_names_no_module_and_says_so(
    shared_server: LiveServer, page: Page, hf_traces: WrittenTraces
) -> None:
    open_session(shared_server, page, "even drift of modules", hf_traces["eager"], hf_traces["bf16"])
    expect(page.locator("#even-growth")).to_contain_text("The error grows evenly through the run: no module stands out")
    expect(page.locator("#culprit")).to_have_count(0)
    expect(page.locator("details.module.culprit")).to_have_count(0)
    expect(page.locator(".culprit-mark")).to_have_count(0)


def test_a_block_that_records_too_little_says_so(
    shared_server: LiveServer, page: Page, hf_traces: WrittenTraces
) -> None:
    open_session(shared_server, page, "inner bug", hf_traces["eager"], hf_traces["bf16_inner_bug"])
    expect(page.locator(".culprit-note")).to_contain_text(
        f"{MODEL_CLASS}.model.layers.1.self_attn records no output: the error appears between its q_proj, k_proj, "
        "v_proj and o_proj"
    )
    expect(page.locator(".culprit-note code").first).to_have_text(f"{MODEL_CLASS}.model.layers.1.self_attn")
    expect(page.locator(".culprit-note")).not_to_contain_text("`")
    expect(page.locator("#culprit")).to_have_count(0)
    expect(page.locator("#even-growth")).to_have_count(0)
    node = page.locator(f'details.module[data-module="{MODEL_CLASS}.model.layers.1.self_attn"]')
    expect(node).to_have_class(re.compile(r"\bverdict-fail\b"))
