"""The module view of a traced session: the reference run's module tree, each module with its verdict and the
error it added, and the modules ranked as culprits (see `engine/culprits.py`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tensor_debugger.engine.culprits import TensorError, rank_culprits, relative_rmse
from tensor_debugger.engine.metrics import json_number, parse_number
from tensor_debugger.ingest.traces import ModuleNode

_WORST = ("error", "incomparable", "fail", "pending", "pass")  # a module's verdict is its worst pair's


@dataclass
class _Module:
    path: str
    pairs: list[dict[str, Any]] = field(default_factory=list)
    children: list[_Module] = field(default_factory=list)


def pair_error(item: dict[str, Any]) -> float | None:
    """A compared pair's relative RMSE; None before it is compared or without element values."""
    stats = item.get("stats")
    if not stats:
        return None
    return relative_rmse(float(parse_number(stats["snr_db"])), int(stats.get("nan_one_side") or 0))


def module_report(items: list[dict[str, Any]], module_tree: dict[str, Any] | None) -> dict[str, Any] | None:
    """`items` are `pair_reports.session_pairs` pairs; None when no pair comes from a module trace or capture."""
    traced = [i for i in items if i.get("module_path")]
    if not traced:
        return None
    candidate = traced[0]["b"]["run_id"]  # with several candidate runs, the first one's modules
    traced = [i for i in traced if i["b"]["run_id"] == candidate]
    errors = [TensorError(i["module_path"], i["place"] or "", i["position"], e)
              for i in traced if (e := pair_error(i)) is not None]
    culprits = rank_culprits(errors)
    by_module: dict[str, list[dict[str, Any]]] = {}
    for item in traced:
        by_module.setdefault(item["module_path"], []).append(item)
    added = {c.module_path: c for c in culprits}
    roots = [ModuleNode.from_json(r) for r in (module_tree or {}).get("roots", [])]
    failing = any(i["status"] != "pass" for i in traced)
    ranked = [{
        "module_path": c.module_path, "added_error": json_number(c.added_error),
        "input_error": json_number(c.input_error), "output_error": json_number(c.output_error),
        "pair_id": _first_output(by_module[c.module_path]),
    } for c in culprits]
    top = ranked[0] if ranked and failing and culprits[0].added_error > 0 else None
    return {
        "has_values": bool((module_tree or {}).get("values", True)),
        "tree": [_node_json(r, by_module, added, top) for r in roots],
        "culprits": ranked,
        "culprit": top,
    }


def _node_json(node: ModuleNode, by_module: dict[str, list[dict[str, Any]]], added: dict[str, Any],
               top: dict[str, Any] | None) -> dict[str, Any]:
    children = [_node_json(c, by_module, added, top) for c in node.children]
    pairs = by_module.get(node.path, [])
    statuses = {p["status"] for p in pairs}
    verdict = next((s for s in _WORST if s in statuses), "none")
    culprit = added.get(node.path)
    return {
        "path": node.path,
        "name": _short_name(node.path),
        "verdict": verdict,
        "failing_inside": sum(c["failing_inside"] + (c["verdict"] in _WORST[:3]) for c in children),
        "added_error": json_number(culprit.added_error) if culprit else None,
        "is_culprit": top is not None and top["module_path"] == node.path,
        "pairs": [{"id": p["id"], "place": p["place"], "status": p["status"], "error": _error_json(p)}
                  for p in pairs],
        "children": children,
    }


def _short_name(path: str) -> str:
    """The last part of a module path; a numbered block keeps its container's name ("layers.3")."""
    parts = path.split(".")
    return ".".join(parts[-2:]) if len(parts) > 1 and parts[-1].isdigit() else parts[-1]


def _error_json(item: dict[str, Any]) -> float | str | None:
    error = pair_error(item)
    return None if error is None else json_number(error)


def _first_output(pairs: list[dict[str, Any]]) -> int | None:
    outputs = [p for p in pairs if (p["place"] or "").startswith("outputs")]
    return outputs[0]["id"] if outputs else None
