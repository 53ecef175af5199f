"""The JSON of pairs, first divergences and unmatched tensors: one shape for the API, the CLI and the pages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session as DbSession

from tensor_debugger.compare.module_reports import module_report
from tensor_debugger.compare.plan import Comparisons
from tensor_debugger.engine.metrics import PairStats, json_number
from tensor_debugger.errors import NotFoundError
from tensor_debugger.store.models import ComparisonResultRecord, PairRecord, RunRecord, TensorRecord, UnmatchedRecord

SUMMARY_STATS = ("max_abs_diff", "mean_abs_diff", "max_rel_diff", "mean_rel_diff", "mse", "rmse", "cosine", "snr_db",
                 "mismatched", "mismatched_fraction", "numel", "argmax", "nan_a", "nan_b", "inf_a", "inf_b",
                 "nan_one_side", "rtol", "atol")


def _side(pair: Any, side: str, tensors: dict[int, Any]) -> dict[str, Any]:
    ids = pair.a_tensor_ids if side == "a" else pair.b_tensor_ids
    shards = [tensors[i] for i in ids]
    shape = list(shards[0].shape)
    for step in (pair.alignment or {}).get("steps", []):
        if step["side"] == side and step["kind"] == "concat":
            shape = list(step["shape"])
    return {"name": pair.a_name if side == "a" else pair.b_name, "shape": shape, "dtype": shards[0].dtype,
            "shards": len(shards), "tensor_ids": list(ids), "run_id": pair.run_a_id if side == "a" else pair.run_b_id}


def pair_json(pair: Any, tensors: dict[int, Any], result: Any | None, full: bool = False) -> dict[str, Any]:
    """`tensors` rows have `name`, `shape` and `dtype`; `result` has `stats`."""
    alignment = pair.alignment or {}
    stats = None
    if result is not None:
        stats = {k: result.stats[k] for k in SUMMARY_STATS} if not full else dict(result.stats)
    return {
        "id": pair.id,
        "position": pair.position,
        "name": pair.name,
        "layer": pair.layer,
        "stage": pair.stage,
        "strategy": pair.strategy,
        "status": pair.status,
        "alignment": alignment.get("words", "no alignment: the shapes cannot be made comparable")
        if pair.alignment is not None else "incomparable: " + " vs ".join(
            str(_side(pair, s, tensors)["shape"]) for s in ("a", "b")),
        "aligned_shape": alignment.get("shape"),
        "alignment_overridden": pair.alignment_overridden,
        "a": _side(pair, "a", tensors),
        "b": _side(pair, "b", tensors),
        "stats": stats,
        "error": pair.error,
        "module_path": pair.module_path,
        "place": pair.place,
        "summary": pair.summary,  # the verdict on summary statistics when element values are not available
    }


Loaded = tuple[dict[int, Any], dict[int, Any]]


def _load(db: DbSession, pairs: Sequence[Any]) -> Loaded:
    """The few columns of tensors and results that pairs show, as light rows (not ORM objects: a session of
    thousands of pairs renders in a fraction of the time)."""
    ids = {i for p in pairs for i in (*p.a_tensor_ids, *p.b_tensor_ids)}
    tensors: dict[int, Any] = {}
    if ids:
        columns = select(TensorRecord.id, TensorRecord.name, TensorRecord.shape, TensorRecord.dtype)
        tensors = {row.id: row for row in db.execute(columns.where(TensorRecord.id.in_(ids)))}
    result_ids = {p.result_id for p in pairs if p.result_id is not None}
    results: dict[int, Any] = {}
    if result_ids:
        columns = select(ComparisonResultRecord.id, ComparisonResultRecord.stats)
        results = {row.id: row for row in db.execute(columns.where(ComparisonResultRecord.id.in_(result_ids)))}
    return tensors, results


def session_pairs(db: DbSession, session_id: int, modules: bool = False) -> dict[str, Any]:
    """Every pair in execution order, the unmatched tensors of each run, the first divergence and progress; with
    `modules`, also the module view of a traced session (its tree and culprits: work the other callers skip)."""
    pairs: Sequence[Any] = db.execute(select(*PairRecord.__table__.columns)  # light rows, as in _load
                                      .where(PairRecord.session_id == session_id).order_by(PairRecord.position)).all()
    tensors, results = _load(db, pairs)
    items = [pair_json(p, tensors, results.get(p.result_id) if p.result_id else None) for p in pairs]
    first = next((i for i in items if i["status"] == "fail"), None)
    runs = dict(db.execute(select(RunRecord.id, RunRecord.label).where(RunRecord.session_id == session_id)).all())
    unmatched = db.scalars(select(UnmatchedRecord).where(UnmatchedRecord.session_id == session_id)
                           .order_by(UnmatchedRecord.run_id, UnmatchedRecord.position)).all()
    done = sum(1 for i in items if i["status"] != "pending")
    report: dict[str, Any] = {
        "pairs": items,
        "first_divergence": divergence_json(first),
        "unmatched": [{"run_id": u.run_id, "run": runs.get(u.run_id), "against_run_id": u.other_run_id,
                       "name": u.name, "tensor_ids": list(u.tensor_ids)} for u in unmatched],
        "progress": {"total": len(items), "done": done, "pending": len(items) - done,
                     "failing": sum(1 for i in items if i["status"] == "fail")},
    }
    if modules:
        tree = db.scalar(select(RunRecord.module_tree).where(RunRecord.id == items[0]["a"]["run_id"])) if items \
            else None  # the reference run's
        report["modules"] = module_report(items, tree)
    return report


def divergence_json(item: dict[str, Any] | None) -> dict[str, Any] | None:
    if item is None:
        return None
    return {"pair_id": item["id"], "name": item["name"], "layer": item["layer"], "stage": item["stage"],
            "max_abs_diff": (item["stats"] or {}).get("max_abs_diff"), "argmax": (item["stats"] or {}).get("argmax")}


def pair_detail(db: DbSession, comparisons: Comparisons, pair_id: int) -> dict[str, Any]:
    pair = db.get(PairRecord, pair_id)
    if pair is None:
        raise NotFoundError(f"no pair with id {pair_id}")
    tensors, results = _load(db, [pair])
    result = results.get(pair.result_id) if pair.result_id else None
    data = pair_json(pair, tensors, result, full=True)
    data["alignment_steps"] = (pair.alignment or {}).get("steps", [])
    data["shapes"] = {"a": [tensors[i].shape for i in pair.a_tensor_ids],
                      "b": [tensors[i].shape for i in pair.b_tensor_ids]}
    data["argmax"] = argmax_json(db, comparisons, pair, result, tensors)
    return data


def argmax_json(db: DbSession, comparisons: Comparisons, pair: PairRecord, result: Any | None,
                tensors: dict[int, Any]) -> dict[str, Any] | None:
    """Where the largest difference is: in aligned coordinates, and in each run's own tensor (shard and index)."""
    if result is None or pair.alignment is None:
        return None
    stats = PairStats.from_json(result.stats)
    if stats.argmax is None:
        return None
    view_a, view_b, _ = comparisons.views(db, pair)
    out: dict[str, Any] = {"aligned": list(stats.argmax), "max_abs_diff": json_number(stats.max_abs_diff)}
    for side, view, ids in (("a", view_a, pair.a_tensor_ids), ("b", view_b, pair.b_tensor_ids)):
        shard, index = view.locate(stats.argmax)
        tensor = tensors[ids[shard]]
        out[side] = {"tensor": tensor.name, "tensor_id": tensor.id, "index": list(index)}
    return out
