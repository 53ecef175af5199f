"""The module view of a traced session: the reference run's module tree, each module with its verdict and the
error it added, and the modules ranked as culprits (see `engine/culprits.py`)."""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tensor_debugger.engine.culprits import TensorError, rank_culprits, rank_stages, relative_rmse
from tensor_debugger.engine.metrics import json_number, parse_number
from tensor_debugger.ingest.traces import ModuleNode
from tensor_debugger.store.reports import PairStatus

if TYPE_CHECKING:  # pair_reports builds this report from its pairs
    from tensor_debugger.compare.pair_reports import PairReport

# JSON has no NaN or Infinity: those travel as "nan", "inf" and "-inf" (metrics.json_number); an integer pair's
# differences and values are exact integers (int64 and uint64 past float64's 2**53 included)
Number = float | int | str


class ModuleVerdict(enum.StrEnum):
    """A module's verdict is its worst pair's; "none" without pairs of its own."""

    ERROR = "error"
    INCOMPARABLE = "incomparable"
    FAIL = "fail"
    PENDING = "pending"
    PASS = "pass"
    NONE = "none"


_WORST = ("error", "incomparable", "fail", "pending", "pass")


@dataclass(frozen=True)
class ModulePair:
    id: int
    place: str | None
    status: PairStatus
    error: Number | None  # the pair's relative RMSE


@dataclass(frozen=True)
class ModuleNodeReport:
    path: str
    name: str
    verdict: ModuleVerdict
    failing_inside: int  # failing modules below it
    added_error: Number | None
    is_culprit: bool
    pairs: list[ModulePair]
    children: list[ModuleNodeReport]


@dataclass(frozen=True)
class CulpritReport:
    module_path: str
    added_error: Number  # relative RMSE of its output minus that of its input
    input_error: Number
    output_error: Number
    pair_id: int | None  # its first output's pair


@dataclass(frozen=True)
class StageCulpritReport:
    """A stage of a plain dump ranked by the error it adds (engine/culprits.py's rank_stages)."""

    name: str
    layer: int | None
    stage: str | None
    previous: str | None  # the tensor before it in execution order
    added_error: Number  # its relative RMSE minus that of the tensor before it
    input_error: Number
    output_error: Number
    pair_id: int


STAGE_CULPRITS = 10  # the most a report lists
_PARAMETER = re.compile(r"(?:^|[._])(?:weight|bias)$")  # a module's parameter, as state dicts name them


def stage_culprits(items: list[PairReport]) -> list[StageCulpritReport]:
    """Without module traces, the stages that add the most error, largest first (at most STAGE_CULPRITS): each
    compared pair's relative RMSE minus that of the pair before it in execution order (the first candidate's),
    among the pairs that carry activations (`carries_activations`)."""
    if not items or any(i.module_path for i in items):
        return []
    candidate = items[0].b.run_id
    mine = [i for i in items if i.b.run_id == candidate and carries_activations(i)]
    by_position = {i.position: i for i in mine}
    errors = [(i.position, e) for i in mine if (e := pair_error(i)) is not None]
    reports = []
    for c in rank_stages(errors)[:STAGE_CULPRITS]:
        item = by_position[c.position]
        before = by_position[c.previous].name if c.previous is not None else None
        reports.append(
            StageCulpritReport(
                item.name,
                item.layer,
                item.stage,
                before,
                json_number(c.added_error),
                json_number(c.input_error),
                json_number(c.output_error),
                item.id,
            )
        )
    return reports


@dataclass(frozen=True)
class ModuleReport:
    has_values: bool
    tree: list[ModuleNodeReport]
    culprits: list[CulpritReport]  # largest added error first
    culprit: CulpritReport | None  # the module that introduced the most error, when any pair fails


def carries_activations(item: PairReport) -> bool:
    """Whether the pair is of values an error flows through, from one stage to the next: of more than one
    floating-point element, and not a parameter. Not a scalar or an integer or boolean tensor (a step counter,
    positions, a mask), which would read as the input of the stage after it with no error, and blame that stage
    for all it carries; nor a weight or bias (a checkpoint's, named `….weight`), which no error flows through."""
    dtype = item.a.dtype.lower()
    return (
        math.prod(item.a.shape) > 1
        and not dtype.startswith(("int", "uint", "bool"))
        and not _PARAMETER.search(item.a.name)
    )


def pair_error(item: PairReport) -> float | None:
    """A compared pair's relative RMSE; None before it is compared or without element values."""
    stats = item.stats
    if not stats:
        return None
    return relative_rmse(float(parse_number(stats.snr_db)), int(stats.nan_one_side or 0))


def module_report(items: list[PairReport], module_tree: dict[str, Any] | None) -> ModuleReport | None:
    """`items` are `pair_reports.session_pairs` pairs; None when no pair comes from a module trace or capture."""
    traced = [i for i in items if i.module_path]
    if not traced:
        return None
    candidate = traced[0].b.run_id  # with several candidate runs, the first one's modules
    traced = [i for i in traced if i.b.run_id == candidate]
    errors = [
        TensorError(i.module_path or "", i.place or "", i.position, e)
        for i in traced
        if (e := pair_error(i)) is not None
    ]
    culprits = rank_culprits(errors)
    by_module: dict[str, list[PairReport]] = {}
    for item in traced:
        by_module.setdefault(item.module_path or "", []).append(item)
    added = {c.module_path: c for c in culprits}
    roots = [ModuleNode.from_json(r) for r in (module_tree or {}).get("roots", [])]
    failing = any(i.status != "pass" for i in traced)
    ranked = [
        CulpritReport(
            c.module_path,
            json_number(c.added_error),
            json_number(c.input_error),
            json_number(c.output_error),
            _first_output(by_module[c.module_path]),
        )
        for c in culprits
    ]
    top = ranked[0] if ranked and failing and culprits[0].added_error > 0 else None
    return ModuleReport(
        bool((module_tree or {}).get("values", True)),
        [_node_report(r, by_module, added, top) for r in roots],
        ranked,
        top,
    )


def _node_report(
    node: ModuleNode, by_module: dict[str, list[PairReport]], added: dict[str, Any], top: CulpritReport | None
) -> ModuleNodeReport:
    children = [_node_report(c, by_module, added, top) for c in node.children]
    pairs = by_module.get(node.path, [])
    statuses = {p.status for p in pairs}
    verdict = ModuleVerdict(next((s for s in _WORST if s in statuses), "none"))
    culprit = added.get(node.path)
    return ModuleNodeReport(
        path=node.path,
        name=_short_name(node.path),
        verdict=verdict,
        failing_inside=sum(c.failing_inside + (c.verdict in _WORST[:3]) for c in children),
        added_error=json_number(culprit.added_error) if culprit else None,
        is_culprit=top is not None and top.module_path == node.path,
        pairs=[ModulePair(p.id, p.place, p.status, _error_json(p)) for p in pairs],
        children=children,
    )


def _short_name(path: str) -> str:
    """The last part of a module path; a numbered block keeps its container's name ("layers.3")."""
    parts = path.split(".")
    return ".".join(parts[-2:]) if len(parts) > 1 and parts[-1].isdigit() else parts[-1]


def _error_json(item: PairReport) -> float | str | None:
    error = pair_error(item)
    return None if error is None else json_number(error)


def _first_output(pairs: list[PairReport]) -> int | None:
    outputs = [p for p in pairs if (p.place or "").startswith("outputs")]
    return outputs[0].id if outputs else None
