"""The model graph's data for the page's script (web/views/module_graph.py's graph_data), without a browser: each
module once, its path relative to its parent's, its flags, and the search's way to its matches."""

from __future__ import annotations

from typing import Any

from tensor_debugger.compare.reports.module_reports import ModuleNodeReport, ModulePair, ModuleReport, ModuleVerdict
from tensor_debugger.store.reports import PairStatus
from tensor_debugger.web.views.module_graph import (
    MATCHED,
    ON_FIRST,
    OPEN,
    TARGET,
    TO_MATCH,
    build_graph,
    graph_data,
)


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


def flatten(packed: list[Any], parent: str = "") -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for entry in packed:
        path = parent + entry[0]
        out[path] = entry
        out.update(flatten(entry[9], path))
    return out


def test_each_module_once_with_its_path_relative_to_its_parent_and_its_flags() -> None:
    data = graph_data(build_graph(tree(), 7))
    nodes = flatten(data["roots"])
    assert len(nodes) == 9 and data["query"] == ""
    down = nodes["model.layers.1.mlp.down_proj"]
    assert down[0] == ".down_proj" and down[1] == "down_proj" and data["verdicts"][down[3]] == "fail"
    assert down[6] == 7 and down[7] & (ON_FIRST | TARGET) == ON_FIRST | TARGET and down[8] == 0
    assert nodes["model.layers.1"][0] == ".layers.1" and nodes["model"][8] == 8
    # open: the path to the first divergence above its module; the rest folded
    opened = {p for p, n in nodes.items() if n[7] & OPEN}
    assert opened == {"model", "model.layers.1", "model.layers.1.mlp"}
    assert not any(n[7] & (MATCHED | TO_MATCH) for n in nodes.values())


def test_a_search_marks_its_matches_and_the_way_to_them() -> None:
    data = graph_data(build_graph(tree(), 7, "DOWN_proj"))
    nodes = flatten(data["roots"])
    assert data["query"] == "DOWN_proj"
    matched = {p for p, n in nodes.items() if n[7] & MATCHED}
    assert matched == {"model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"}
    way = {p for p, n in nodes.items() if n[7] & TO_MATCH}
    assert way == matched | {"model", "model.layers.0", "model.layers.1", "model.layers.0.mlp", "model.layers.1.mlp"}
    assert nodes["model.layers.0"][7] & OPEN and not nodes["model.layers.0.attn"][7] & TO_MATCH
