"""The database rows an ingest writes for a run's tensors and problems, built from what it stored."""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from pathlib import PurePosixPath
from typing import Any

from tensor_debugger.engine.names import module_layer, parse_layer_stage
from tensor_debugger.engine.summary_compare import Sketch, SketchJson
from tensor_debugger.errors import SECOND_TENSOR_OF_A_NAME, FileProblem
from tensor_debugger.ingest.inputs import RunTrace
from tensor_debugger.ingest.stored import Stored, stored_name
from tensor_debugger.ingest.traces import TraceTensor


def summary_row(run_id: int, position: int, run_trace: RunTrace, traced: TraceTensor) -> dict[str, Any]:
    """A tensor of a trace without element values: what its JSON says, and no array; as the values of its row, for
    one INSERT of many rows (a summary capture's hundreds: ORM objects cost about twice as much CPU)."""
    shape = list(traced.shape or ())
    stats: dict[str, float | None] = dict(traced.stats)
    sketch = None
    stored_sketch: dict[str, Any] | None = None
    if traced.sketch is not None:
        try:
            sketch = Sketch.from_json(traced.sketch)
        except (KeyError, TypeError, ValueError) as exc:
            raise FileProblem(run_trace.label, f"{traced.name}: a malformed summary ({exc})") from exc
        stats = {"min": sketch.min, "max": sketch.max, "mean": sketch.mean, "std": sketch.std}
        packed = traced.sketch.get("sample_f64")  # already packed (and read back whole just now): kept as it is
        if isinstance(traced.sketch, SketchJson):  # `to_json(compact=True)` of this sketch, in this process
            stored_sketch = traced.sketch
        elif isinstance(packed, str):
            stored_sketch = {**sketch.head_json(), "sample_f64": packed}
        else:
            stored_sketch = sketch.to_json(compact=True)
    if traced.op is not None:
        layer = module_layer(traced.module_path)
    else:
        layer = parse_layer_stage(PurePosixPath(traced.module_path), ())[0]
    return dict(
        run_id=run_id,
        position=position,
        name=run_trace.summary_name(traced),
        source_file=run_trace.label,
        key_path=[],
        layer=layer,
        stage=None,
        shape=shape,
        dtype=traced.dtype or "unknown",
        store_key="",
        nbytes=0,
        digest=f"none:{uuid.uuid4().hex}",
        numel=math.prod(shape),
        min=stats.get("min"),
        max=stats.get("max"),
        mean=stats.get("mean"),
        std=stats.get("std"),
        nan_count=sketch.nan if sketch else 0,
        inf_count=sketch.inf if sketch else 0,
        module_path=traced.module_path,
        place=traced.place,
        source=traced.source,
        parameter=traced.parameter,
        has_values=False,
        sketch=stored_sketch,  # compact, as a stored tensor's row keeps it
    )


def tensor_rows(run_id: int, stored: Sequence[Stored], problems: list[FileProblem]) -> list[dict[str, Any]]:
    """The rows of a run's stored tensors, in order, as the values of one INSERT of many rows: every column but
    the id, None as NULL (none of the columns a row may leave None has a default; ORM objects went in one INSERT a
    row, as SQLite's RETURNING of their ids keeps no order). Named as `stored_name` names them, a second tensor of
    the same name kept as "name (2)" with a problem appended to `problems` saying so; layer and stage from the
    file's path and key path (a captured op's from its module)."""
    seen: dict[str, int] = {}
    first_from: dict[str, str] = {}  # name -> the file its first tensor came from
    rows: list[dict[str, Any]] = []
    for position, (entry, key_path, tensor) in enumerate(stored):
        name = stored_name(entry, key_path)
        if entry.module_path is not None and key_path == ("data",):
            key_path = ()  # as `stored_name` names it
        if name in seen:
            seen[name] += 1
            reason = (
                f"{SECOND_TENSOR_OF_A_NAME}{name!r} (the first is from {first_from[name]}, and that one is paired by "
                f"the name); kept as {name} ({seen[name]})"
            )
            problems.append(FileProblem(entry.label, reason))
            name = f"{name} ({seen[name]})"
        seen.setdefault(name, 1)
        first_from.setdefault(name, entry.label)
        layer, stage = parse_layer_stage(entry.relpath, key_path)
        if layer is None and entry.source is not None and "/" in (entry.module_path or ""):  # a captured op
            layer = module_layer(entry.module_path or "")
        s = tensor.summary
        rows.append(
            dict(
                run_id=run_id,
                position=position,
                name=name,
                source_file=entry.label,
                key_path=list(key_path),
                layer=layer,
                stage=stage,
                shape=list(tensor.shape),
                dtype=tensor.dtype.name,
                store_key=tensor.store_key,
                nbytes=tensor.nbytes,
                digest=tensor.digest,
                numel=s.numel,
                min=s.min,
                max=s.max,
                mean=s.mean,
                std=s.std,
                nan_count=s.nan_count,
                inf_count=s.inf_count,
                module_path=entry.module_path,
                place=entry.place,
                source=entry.source,
                parameter=entry.parameter,
                has_values=True,
                sketch=tensor.sketch,
            )
        )
    return rows


def problem_rows(run_id: int, problems: Sequence[FileProblem]) -> list[dict[str, Any]]:
    """The rows that keep a run's problems, each with whether it held no tensor (and whether it is a capture's
    note), as the values of one INSERT of many rows."""
    return [dict(run_id=run_id, file=p.file, reason=p.reason, ignored=p.ignored, note=p.note) for p in problems]
