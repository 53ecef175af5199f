"""The model graph's tree as the server renders it (web/views/module_graph.py's graph_html), without a browser: each
module once as a box in nested lists, folded modules' children inside a closed <details>, open on the path to the
first divergence, in the first two levels and on the way to a search's matches."""

from __future__ import annotations

from html.parser import HTMLParser

from tensor_debugger.compare.reports.module_reports import ModuleNodeReport, ModulePair, ModuleReport, ModuleVerdict
from tensor_debugger.store.reports import PairStatus
from tensor_debugger.web.views.module_graph import build_graph, graph_html


def node(path: str, verdict: str, pairs: list[ModulePair], children: list[ModuleNodeReport]) -> ModuleNodeReport:
    name = path.rsplit(".", 1)[-1] if not path.rsplit(".", 1)[-1].isdigit() else ".".join(path.split(".")[-2:])
    return ModuleNodeReport(path, name, ModuleVerdict(verdict), 0, None, False, pairs, children)


def tree() -> ModuleReport:
    """model > layers.0 > (attn, mlp > down_proj), model > layers.1 > (attn, mlp > down_proj); layer 1's down_proj
    holds the first divergence (pair 7)."""
    layers = []
    for k, status in ((0, "pass"), (1, "fail")):
        pair = ModulePair(10 + k if k == 0 else 7, "outputs", PairStatus(status), 0.5 if k else 0.0)
        down = node(f"model.layers.{k}.mlp.down_proj", status, [pair], [])
        mlp = node(f"model.layers.{k}.mlp", status, [], [down])
        attn = node(f"model.layers.{k}.attn", "pass", [ModulePair(20 + k, "outputs", PairStatus.PASS, 1e-6)], [])
        layers.append(node(f"model.layers.{k}", status, [], [attn, mlp]))
    return ModuleReport(True, [node("model", "fail", [], layers)], [], None)


class Boxes(HTMLParser):
    """Each box's link text with its classes, whether every <details> around it is open, the chain of names of the
    boxes above it, and the <summary> texts of the details around it."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[tuple[str, bool]] = []  # open elements: (tag, open) for details, (tag, False) otherwise
        self.names: list[str] = []  # the names of the boxes on the way down: one per <li> entered
        self.boxes: dict[str, dict[str, object]] = {}
        self.classes = ""
        self.in_name = False
        self.href: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        self.stack.append((tag, tag == "details" and "open" in found))
        if tag == "div" and "gnode" in (found.get("class") or ""):
            self.classes = found.get("class") or ""
            self.box_id = found.get("id")
        elif tag in ("a", "span") and self.stack[-2][0] == "div" and self.classes:
            self.in_name, self.href = True, found.get("href")

    def handle_endtag(self, tag: str) -> None:
        popped = self.stack.pop()
        assert popped[0] == tag, (popped, tag)
        if tag == "li" and self.names and len([t for t, _ in self.stack if t == "li"]) < len(self.names):
            self.names.pop()
        if tag in ("a", "span"):
            self.in_name = False

    def handle_data(self, data: str) -> None:
        if self.in_name:
            path = ".".join([*self.names, data]) if data != "model" else data
            details = [is_open for tag, is_open in self.stack if tag == "details"]
            self.boxes[path] = {
                "classes": set(self.classes.split()),
                "shown": all(details),
                "href": self.href,
                "id": self.box_id,
            }
            self.names.append(data)
            self.classes = ""


def boxes(report: ModuleReport, first: int | None, query: str = "") -> dict[str, dict[str, object]]:
    parser = Boxes()
    parser.feed(str(graph_html(build_graph(report, first, query))))
    parser.close()
    assert not parser.stack  # every element closed
    return parser.boxes


def test_each_module_once_open_on_the_path_and_in_the_first_levels_folded_elsewhere() -> None:
    found = boxes(tree(), 7)
    assert len(found) == 9
    down = found["model.layers.1.mlp.down_proj"]
    assert down["href"] == "/pairs/7" and down["id"] == "first-divergence"
    assert {"on-path", "first", "target", "v-fail"} <= down["classes"]  # type: ignore[operator]
    shown = {p for p, b in found.items() if b["shown"]}
    # the root and the layers are open (the first two levels), the path to the first divergence too
    assert shown == {
        "model",
        "model.layers.0",
        "model.layers.1",
        "model.layers.0.attn",
        "model.layers.0.mlp",
        "model.layers.1.attn",
        "model.layers.1.mlp",
        "model.layers.1.mlp.down_proj",
    }
    assert not found["model.layers.0.mlp.down_proj"]["shown"]  # folded: in the page, inside a closed <details>
    assert sum("on-path" in b["classes"] for b in found.values()) == 4  # type: ignore[operator]


def test_a_search_shows_its_matches_and_folds_the_other_modules_on_the_way() -> None:
    html = str(graph_html(build_graph(tree(), 7, "DOWN_proj")))
    found = boxes(tree(), 7, "DOWN_proj")
    matched = {p for p, b in found.items() if "matched" in b["classes"]}  # type: ignore[operator]
    assert matched == {"model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"}
    assert all(found[m]["shown"] for m in matched)
    # layer 0's attn is off the way to a match: it waits behind "1 other module here"
    assert not found["model.layers.0.attn"]["shown"] and "<summary>1 other module here</summary>" in html
    assert found["model.layers.1.attn"]["shown"] is False


def test_names_are_escaped() -> None:
    report = tree()
    odd = ModuleNodeReport("model.<b>", "<b>", ModuleVerdict.PASS, 0, None, False, [], [])
    root = report.tree[0]
    report = ModuleReport(True, [ModuleNodeReport(**{**root.__dict__, "children": [*root.children, odd]})], [], None)
    html = str(graph_html(build_graph(report, 7)))
    assert "<b>" not in html and "&lt;b&gt;" in html
