"""The model as a graph (/sessions/{id}/graph): a traced or captured session's module tree drawn as boxes joined by
parent-child edges, each box coloured by the error of its module on a log scale (the error it added where it can
be ranked, else the largest relative RMSE of its pairs), the path from the root to the first divergence and to each
culprit highlighted. Collapsed by default: only the highlighted paths and the ancestors of what a search found
are open, so a 2,000-module model opens as a handful of boxes; a click on a box's name opens its pair.

The page gets the tree once as compact JSON (`graph_data`) and its script (web/static/module_graph.js) builds the
boxes of the open modules only, and a folded module's children when it is opened: 2,000 modules rendered as HTML
were 594 kB and 11,485 elements, most of them folded away."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tensor_debugger.compare.reports.formatting import format_error
from tensor_debugger.compare.reports.module_reports import ModuleNodeReport, ModuleReport, ModuleVerdict
from tensor_debugger.engine.metrics import Number, parse_number

BINS = 8  # colour classes e0 (smallest decade) to e7 (largest) in the stylesheet


@dataclass(frozen=True)
class GraphNode:
    path: str
    name: str
    verdict: str
    error: float | None  # what colours the box
    error_kind: str  # "added" or "rel. RMSE"
    shade: str  # a CSS class: e0..e7, "exact" (0), "nan", "none" (no error known)
    pair_id: int | None  # the pair a click opens: its output's, else its first
    on_path: str  # "first", "culprit", "first culprit" or "": on the way to the first divergence or a culprit
    is_target: bool  # the first divergence's module or a culprit itself
    matched: bool  # its name matched the search
    open: bool
    descendants: int
    children: list[GraphNode]


@dataclass(frozen=True)
class ModuleGraph:
    roots: list[GraphNode]
    low: int  # decades of the colour scale
    high: int
    legend: list[tuple[str, str]]  # (class, label)
    modules: int
    matches: int
    query: str


def _float(value: Number | None) -> float | None:
    parsed = parse_number(value) if value is not None else None
    return None if parsed is None else float(parsed)


def _error(node: ModuleNodeReport) -> tuple[float | None, str]:
    added = _float(node.added_error)
    if added is not None:
        return added, "added"
    outputs = [p for p in node.pairs if (p.place or "").startswith("output")]
    errors = [e for p in outputs or node.pairs if (e := _float(p.error)) is not None]
    kind = "output rel. RMSE" if outputs else "rel. RMSE"
    if any(math.isnan(e) for e in errors):
        return math.nan, kind
    return (max(errors), kind) if errors else (None, "")


def _label(value: float) -> str:
    """3 significant digits, scientific outside 1e-3..1e4, as the pages write numbers."""
    return f"{value:.3g}" if 1e-3 <= value < 1e4 else f"{value:.2e}".replace("e-0", "e-").replace("e+0", "e")


def _walk(nodes: Iterable[ModuleNodeReport]) -> Iterable[ModuleNodeReport]:
    for node in nodes:
        yield node
        yield from _walk(node.children)


def _ancestors(path: str) -> set[str]:
    parts = path.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)}


def build_graph(modules: ModuleReport, first_pair: int | None, query: str = "") -> ModuleGraph:
    everything = list(_walk(modules.tree))
    errors = {n.path: _error(n) for n in everything}
    positive = [math.log10(e) for e, _ in errors.values() if e is not None and math.isfinite(e) and e > 0]
    low = math.floor(min(positive)) if positive else -8
    high = max(math.ceil(max(positive)) if positive else 0, low + 1)
    first = next(
        (n.path for n in everything if first_pair is not None and any(p.id == first_pair for p in n.pairs)), None
    )
    culprits = {c.module_path for c in modules.culprits}
    first_path = _ancestors(first) if first else set()
    culprit_path = set().union(*(_ancestors(c) for c in culprits)) if culprits else set()
    wanted = query.strip().lower()
    matched = {n.path for n in everything if wanted and wanted in n.path.lower()}
    open_for_match = set().union(*(_ancestors(m) - {m} for m in matched)) if matched else set()

    def shade(error: float | None) -> str:
        if error is None:
            return "none"
        if math.isnan(error) or math.isinf(error):
            return "nan"
        if error <= 0:
            return "exact"
        t = (math.log10(error) - low) / (high - low)
        return f"e{min(BINS - 1, max(0, int(t * BINS)))}"

    def node_of(report: ModuleNodeReport) -> GraphNode:
        children = [node_of(c) for c in report.children]
        error, kind = errors[report.path]
        output = next(
            (p for p in report.pairs if (p.place or "").startswith("output")), report.pairs[0] if report.pairs else None
        )
        path_kinds = [
            k for k, on in (("first", report.path in first_path), ("culprit", report.path in culprit_path)) if on
        ]
        is_target = report.path == first or report.path in culprits
        return GraphNode(
            report.path,
            report.name,
            str(report.verdict),
            error,
            kind,
            shade(error),
            output.id if output is not None else None,
            " ".join(path_kinds),
            is_target,
            report.path in matched,
            bool(children) and ((bool(path_kinds) and not is_target) or report.path in open_for_match),
            sum(1 + c.descendants for c in children),
            children,
        )

    roots = [node_of(r) for r in modules.tree]
    span = (high - low) / BINS
    legend = [(f"e{k}", f"≥ {_label(10 ** (low + k * span))}") for k in range(BINS)]
    return ModuleGraph(roots, low, high, legend, len(everything), len(matched), query.strip())


# A node's flags in graph_data: on the path to the first divergence, on a culprit's, the first divergence's module or
# a culprit itself, matched by the search, open, on the way to a match (a match or above one)
ON_FIRST, ON_CULPRIT, TARGET, MATCHED, OPEN, TO_MATCH = 1, 2, 4, 8, 16, 32
VERDICTS = tuple(str(v) for v in ModuleVerdict)


def graph_data(graph: ModuleGraph) -> dict[str, Any]:
    """The tree as the page's script reads it: each node a list [path relative to its parent's (with its leading
    "." or "/"; a root's whole path), name, shade, verdict (an index into "verdicts"), error as the pages write it,
    error kind (an index into "kinds"), pair id or null, flags (the bits above), modules inside, children]; and the
    search's text ("query")."""
    kinds: list[str] = []
    to_match = {a for m in _matched_paths(graph.roots) for a in _ancestors(m)}

    def kind(name: str) -> int:
        if name not in kinds:
            kinds.append(name)
        return kinds.index(name)

    def pack(node: GraphNode, parent: str) -> list[Any]:
        flags = (
            (ON_FIRST if "first" in node.on_path.split() else 0)
            | (ON_CULPRIT if "culprit" in node.on_path.split() else 0)
            | (TARGET if node.is_target else 0)
            | (MATCHED if node.matched else 0)
            | (OPEN if node.open else 0)
            | (TO_MATCH if node.path in to_match else 0)
        )
        relative = node.path[len(parent) :] if parent and node.path.startswith(parent) else node.path
        return [
            relative,
            node.name,
            node.shade,
            VERDICTS.index(node.verdict),
            format_error(node.error) if node.error is not None else "",
            kind(node.error_kind),
            node.pair_id,
            flags,
            node.descendants,
            [pack(c, node.path) for c in node.children],
        ]

    roots = [pack(r, "") for r in graph.roots]
    return {"verdicts": list(VERDICTS), "kinds": kinds, "query": graph.query, "roots": roots}


def _matched_paths(nodes: list[GraphNode]) -> Iterable[str]:
    for node in nodes:
        if node.matched:
            yield node.path
        yield from _matched_paths(node.children)
