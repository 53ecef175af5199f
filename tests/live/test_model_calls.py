"""A capture around several calls of the model (`generate`'s forwards, a loop of steps). Through a served app's
pages: each call of the model is a module tree of its own, side by side at the top in call order, and the first
divergence is marked inside the call that made it. The recorder keeps the calls under one node of the model's path
(its trace JSON has one root): the pages showed that node holding the model's own node (`Step` inside `Step`), and
the graph highlighted the way to a module of the second call (`Step.cache#2`) through the first call (`Step`). The
session's next capture (from summaries) called each model once as if that were what was captured: it says so, and
what its one forward records."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch
from sqlalchemy import select
from tensor_debugger import capture
from tensor_debugger.compare.reports.contract import compare_report
from tensor_debugger.services import open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store.models import RunRecord, TensorRecord
from torch import nn

from tests.support import loopback_http
from tests.support.servers import LiveServer, free_port, wait_done
from tests.support.sessions import compared

DIM = 8


class Cache(nn.Module):
    """A cache of keys: each call appends its key (the port prepends it: the same values on the first call only)."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        self.held = torch.zeros(1, 0, DIM)
        self.port = port

    def forward(self, key: torch.Tensor) -> torch.Tensor:
        self.held = torch.cat([key, self.held] if self.port else [self.held, key], dim=1)
        return self.held


class Step(nn.Module):
    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList([nn.Linear(DIM, DIM)])
        self.k, self.q = nn.Linear(DIM, DIM), nn.Linear(DIM, DIM)
        self.cache = Cache(port)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers[0](x)
        held = self.cache(self.k(x))
        weights = (self.q(x) @ held.transpose(1, 2)).softmax(-1)
        out: torch.Tensor = weights @ held
        return out


class _Modules(HTMLParser):
    """The session page's module tree: each module's (depth, path), and the modules holding the pair marked as the
    first divergence."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str | None] = []  # each open <details>: its module, None where it is no module's
        self.found: list[tuple[int, str]] = []
        self.marked: list[list[str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "details":
            module = values.get("data-module")
            if module is not None:
                self.found.append((sum(1 for m in self.stack if m is not None), module))
            self.stack.append(module)
        elif tag == "li" and values.get("class") == "first-divergence":
            self.marked.append([m for m in self.stack if m is not None])

    def handle_endtag(self, tag: str) -> None:
        if tag == "details":
            self.stack.pop()


class _Graph(HTMLParser):
    """The graph page's boxes: (depth in its lists, name, the box's classes)."""

    def __init__(self) -> None:
        super().__init__()
        self.depth = 0
        self.box: str | None = None
        self.named = False
        self.found: list[tuple[int, str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        classes = dict(attrs).get("class") or ""
        if tag == "ul":
            self.depth += 1
        elif tag == "div" and "gnode" in classes.split():
            self.box = classes
        elif tag in ("a", "span") and self.box is not None:
            self.named = True

    def handle_data(self, data: str) -> None:
        if self.named and self.box is not None:
            self.found.append((self.depth, data, self.box))
            self.box, self.named = None, False

    def handle_endtag(self, tag: str) -> None:
        if tag == "ul":
            self.depth -= 1


STEPS = torch.randn(3, 1, 1, DIM, generator=torch.Generator().manual_seed(1))


def captured(data: Path) -> None:
    """Both sides' three steps captured by hand, as summaries, into session 1 of `data`."""
    for port, run in ((False, "reference"), (True, "candidate")):
        model = Step(port).eval()
        with torch.no_grad(), capture(model, "steps", run, data_dir=data, level="op", values="summary"):
            for x in STEPS:
                model(x)


def test_each_call_of_the_model_is_a_tree_at_the_top_and_the_first_divergence_is_in_its_call(tmp_path: Path) -> None:
    data = tmp_path / "data"
    captured(data)
    server = LiveServer(data, free_port()).start()
    try:
        report = wait_done(server, 1)
        first = report["first_divergence"]
        assert first is not None and first["name"] == "Step.cache#2/cat#1_outputs", first
        session = loopback_http.get(f"{server.url}/sessions/1", timeout=60)
        graph = loopback_http.get(f"{server.url}/sessions/1/graph", timeout=60)
        pair = loopback_http.get(f"{server.url}/pairs/{first['pair_id']}", timeout=60)
    finally:
        server.stop()
    assert session.status_code == graph.status_code == pair.status_code == 200

    # the session's module tree: the three calls at the top, in call order, each holding its own modules
    parser = _Modules()
    parser.feed(session.text)
    modules = parser.found
    assert [path for depth, path in modules if depth == 0] == ["Step", "Step#2", "Step#3"], modules
    assert [path for depth, path in modules if depth == 1 and path.startswith("Step.")] == [
        "Step.layers.0",
        "Step.k",
        "Step.cache",
        "Step.q",
        "Step.layers.0#2",
        "Step.k#2",
        "Step.cache#2",
        "Step.q#2",
        "Step.layers.0#3",
        "Step.k#3",
        "Step.cache#3",
        "Step.q#3",
    ], modules
    starts = [i for i, (depth, _) in enumerate(modules) if depth == 0] + [len(modules)]
    for call, (start, end) in zip(("", "#2", "#3"), zip(starts, starts[1:], strict=False), strict=True):
        inside = [path for _, path in modules[start + 1 : end]]
        assert f"Step.cache{call}" in inside and f"Step.cache{call}/cat#1" in inside, (call, inside)
        assert all(
            p.startswith(
                (f"Step{call}/", f"Step.layers.0{call}", f"Step.k{call}", f"Step.q{call}", f"Step.cache{call}")
            )
            for p in inside
        )
    # the first divergence marked once, inside the second call's cache
    assert parser.marked == [["Step#2", "Step.cache#2", "Step.cache#2/cat#1"]], parser.marked

    # the graph: the calls side by side, the way to the first divergence through the second call only
    boxes_of = _Graph()
    boxes_of.feed(graph.text)
    boxes = boxes_of.found
    top = min(depth for depth, _, _ in boxes)
    assert [name for depth, name, _ in boxes if depth == top] == ["Step", "Step#2", "Step#3"], boxes
    # a numbered block keeps its container's name in every call (`layers.0#2`, not `0#2`)
    assert [name for depth, name, _ in boxes if depth == top + 1 and "layers" in name] == [
        "layers.0",
        "layers.0#2",
        "layers.0#3",
    ], boxes
    on_path = [name for _, name, classes in boxes if "first" in classes.split()]
    assert on_path == ["Step#2", "cache#2", "cat#1"], boxes
    assert 'id="first-divergence"' in graph.text

    assert "Module Step.cache#2/cat#1, outputs" in pair.text


def test_the_next_capture_of_several_calls_says_it_runs_one_forward_and_runs_as_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    monkeypatch.setenv("TENSOR_DEBUGGER_DATA_DIR", str(data))  # the snippet's capture(), with no data_dir=
    captured(data)
    settings = Settings(data_dir=data, demo=False)
    report = compared(settings, 1, modules=True)
    first = report.first_divergence
    assert first is not None and first.basis == "summary" and first.name == "Step.cache#2/cat#1_outputs", first
    typed = compare_report(1, "steps", "http://127.0.0.1/sessions/1", report, [])
    assert typed.next_capture is not None
    python = typed.next_capture.python
    said = " ".join(line.removeprefix("# ") for line in python.splitlines() if line.startswith("# "))
    assert said.startswith("The runs compared called the model 3 times (Step, Step#2, Step#3: "), python
    assert "the first divergence is in its call 2 (Step#2)" in said, said
    assert "This snippet runs ONE forward of each model on `inputs`" in said, said
    assert "modules='cache*' it records are named as the first call's (Step...)" in said, said
    assert python.count("    reference(inputs)") == python.count("    candidate(inputs)") == 1, python

    # as printed: one forward of each model, the tensors of `cache` named as a first call's
    exec(python, {"reference": Step(False).eval(), "candidate": Step(True).eval(), "inputs": STEPS[0]})
    services = open_services(settings)
    try:
        with services.sessions() as db:
            names = {
                label: list(
                    db.scalars(
                        select(TensorRecord.name)
                        .join(RunRecord, RunRecord.id == TensorRecord.run_id)
                        .where(RunRecord.session_id == 1, RunRecord.label == label)
                    )
                )
                for label in ("reference (full)", "candidate (full)")
            }
    finally:
        services.close()
    for label, held in names.items():
        assert "Step.cache/cat#1_outputs" in held and not any("#2" in n for n in held), (label, held)


def test_the_next_capture_of_one_call_says_nothing_of_calls(tmp_path: Path) -> None:
    data = tmp_path / "data"
    for port, run in ((False, "reference"), (True, "candidate")):
        model = Step(port).eval()
        model.cache.held = torch.randn(1, 2, DIM, generator=torch.Generator().manual_seed(3))  # one call shows it
        with torch.no_grad(), capture(model, "steps", run, data_dir=data, level="op", values="summary"):
            model(STEPS[0])
    report = compared(Settings(data_dir=data, demo=False), 1, modules=True)
    assert report.first_divergence is not None and report.first_divergence.basis == "summary"
    typed = compare_report(1, "steps", "http://127.0.0.1/sessions/1", report, [])
    assert typed.next_capture is not None
    said = [line for line in typed.next_capture.python.splitlines() if line.startswith("#")]
    # what `inputs` must hold, and nothing of calls
    given = "# inputs: the model's one positional argument (a tensor), as the runs compared called the model (Step)"
    assert said == [given]
