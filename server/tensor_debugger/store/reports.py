"""The JSON shapes of sessions, runs, tensors and problems: one place for the API, the CLI and the pages."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from tensor_debugger.errors import FileProblem
from tensor_debugger.store.models import ProblemRecord, RunRecord, SessionRecord, TensorRecord


def iso(moment: datetime) -> str:
    """ISO 8601 with the zone; SQLite hands back naive datetimes, which are stored as UTC."""
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).isoformat()


def problem_json(problem: FileProblem | ProblemRecord) -> dict[str, str]:
    return {"file": problem.file, "reason": problem.reason}


def run_json(run: RunRecord, with_problems: bool = False) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": run.id,
        "label": run.label,
        "role": run.role,
        "position": run.position,
        "status": run.status,
        "sources": list(run.sources),
        "tensors": run.tensor_count,
        "total_bytes": run.total_bytes,
        "created_at": iso(run.created_at),
    }
    if with_problems:
        data["problems"] = [problem_json(p) for p in run.problems]
    return data


def session_json(session: SessionRecord, with_problems: bool = False) -> dict[str, Any]:
    return {
        "id": session.id,
        "name": session.name,
        "notes": session.notes,
        "created_at": iso(session.created_at),
        "tolerances": {"rtol": session.rtol, "atol": session.atol},
        "runs": [run_json(r, with_problems) for r in session.runs],
    }


def tensor_json(tensor: TensorRecord) -> dict[str, Any]:
    return {
        "id": tensor.id,
        "run_id": tensor.run_id,
        "name": tensor.name,
        "source_file": tensor.source_file,
        "key_path": list(tensor.key_path),
        "layer": tensor.layer,
        "stage": tensor.stage,
        "shape": list(tensor.shape),
        "dtype": tensor.dtype,
        "nbytes": tensor.nbytes,
        "digest": tensor.digest,
        "stats": {
            "numel": tensor.numel,
            "min": tensor.min,
            "max": tensor.max,
            "mean": tensor.mean,
            "std": tensor.std,
            "nan": tensor.nan_count,
            "inf": tensor.inf_count,
        },
    }
