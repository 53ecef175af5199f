"""The model as a graph (/sessions/{id}/graph): a traced or captured session's module tree drawn as boxes joined by
parent-child edges, each box coloured by the error of its module on a log scale (the error it added where it can
be ranked, else the largest relative RMSE of its pairs), the path from the root to the first divergence and to each
culprit highlighted. Collapsed by default: the first two levels, the highlighted paths and the ancestors of what a
search found are open, so a 2,000-module model opens as a few hundred boxes; a click on a box's name opens its pair.

The server renders the whole tree as nested lists with a <details> per module that has modules inside
(`graph_html`), so the page works without a script and has none: the browser folds and opens it. At 2,008 modules
that is about 280 kB and 9,500 elements, most inside closed <details> that the browser does not lay out."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html import escape  # str in, str out: markupsafe's makes a Markup object per call
from typing import Protocol

from tensor_debugger.compare.reports.formatting import format_error
from tensor_debugger.compare.reports.module_reports import ModuleNodeReport, ModuleReport
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
    first: str | None = None  # the first divergence's module


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


class _Tree(Protocol):
    @property
    def path(self) -> str: ...

    @property
    def children(self) -> Sequence[_Tree]: ...


def _lineages(nodes: Iterable[_Tree]) -> dict[str, set[str]]:
    """Each module's path with the paths of the modules above it, as the tree holds them (not read off the name: a
    module of the model's second call is `Net.attn#2`, inside `Net#2`, not inside `Net`; an op is `Net.attn/mul#1`,
    inside `Net.attn`)."""
    found: dict[str, set[str]] = {}

    def visit(node: _Tree, above: set[str]) -> None:
        mine = found[node.path] = above | {node.path}
        for child in node.children:
            visit(child, mine)

    for node in nodes:
        visit(node, set())
    return found


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
    lineages = _lineages(modules.tree)
    first_path = lineages.get(first, {first}) if first else set()
    culprit_path = set().union(*(lineages.get(c, {c}) for c in culprits)) if culprits else set()
    wanted = query.strip().lower()
    matched = {n.path for n in everything if wanted and wanted in n.path.lower()}
    open_for_match = set().union(*(lineages[m] - {m} for m in matched)) if matched else set()

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
    return ModuleGraph(roots, low, high, legend, len(everything), len(matched), query.strip(), first)


def graph_html(graph: ModuleGraph) -> str:
    """The tree as nested lists, each module a box (its name linking its pair, its verdict, its error) and, where it
    has modules inside, a <details> holding them: open on the highlighted paths, in the first two levels and on the
    way to a search's matches, folded elsewhere, so the page works without a script. With a search, an open
    module's children off the way to a match wait in one folded "N other modules here" <details> after the others.
    Built as strings, not by the template: 2,008 modules through a recursive Jinja macro took several times as
    long."""
    out: list[str] = []
    searching = bool(graph.query)
    write = out.append

    def item(node: GraphNode, depth: int) -> None:
        classes = f"gnode shade-{node.shade} v-{node.verdict}"
        if node.on_path:
            classes += f" on-path {node.on_path}"
        if node.is_target:
            classes += " target"
        if node.matched:
            classes += " matched"
        write('<li class="on-path">' if node.on_path else "<li>")
        anchor = ' id="first-divergence"' if node.is_target and "first" in node.on_path.split() else ""
        write(f'<div class="{classes}"{anchor}>')
        name = escape(node.name)
        write(f'<a href="/pairs/{node.pair_id}">{name}</a>' if node.pair_id is not None else f"<span>{name}</span>")
        words = [node.verdict] if node.verdict != "none" else []
        if node.error is not None:
            words.append(f"{escape(node.error_kind)} {format_error(node.error)}")
        write(f" <small>{' · '.join(words)}")
        if node.is_target:
            write(f" <strong>{'first divergence' if 'first' in node.on_path.split() else 'culprit'}</strong>")
        write("</small></div>")
        if node.children:
            opened = node.open or depth < OPEN_LEVELS
            write(f"<details{' open' if opened else ''}><summary>{node.descendants} modules inside</summary><ul>")
            if searching and opened:
                way = [c for c in node.children if c.on_path or c.path in to_match]
                rest = [c for c in node.children if not (c.on_path or c.path in to_match)]
            else:
                way, rest = node.children, []
            for child in way:
                item(child, depth + 1)
            if rest:
                many = "s" if len(rest) > 1 else ""
                write(f'<li class="others"><details><summary>{len(rest)} other module{many} here</summary><ul>')
                for child in rest:
                    item(child, depth + 1)
                write("</ul></details></li>")
            write("</ul></details>")
        write("</li>")

    lineages = _lineages(graph.roots)
    to_match = set().union(*(lineages[m] for m in _matched_paths(graph.roots)))
    for root in graph.roots:
        item(root, 0)
    return "".join(out)


OPEN_LEVELS = 2  # the root and the modules right inside it start open (whatever else is folded)


def _matched_paths(nodes: list[GraphNode]) -> Iterable[str]:
    for node in nodes:
        if node.matched:
            yield node.path
        yield from _matched_paths(node.children)
