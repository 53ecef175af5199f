"""How a capture into the local data dir stores its run: the trace JSON it never writes to disk (read from memory in
place of its file) gives the same run, row for row, as that JSON written out and ingested from its folder as any
trace is. A real model (a tiny Llama built by transformers), an op summary capture with a selection of modules and a
note; the file's side goes through `Ingestor.ingest`, json and all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from sqlalchemy import select
from tensor_debugger.ingest.inputs import InputFile, RunTrace
from tensor_debugger.ingest.run_rows import summary_row
from tensor_debugger.ingest.sketches import sketch
from tensor_debugger.ingest.traces import ModuleNode, Trace, TraceTensor
from tensor_debugger.live.recorder import record, summarize_forward
from tensor_debugger.services import open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store.models import ProblemRecord, RunRecord, TensorRecord

from tests.support.traces import input_ids, tiny_llama

# differ by construction: row ids, the run's, a summary row's unique placeholder digest, the file label
_OWN = {"id", "run_id", "digest", "source_file"}


def _run(settings: Settings, run_id: int) -> tuple[list[dict[str, Any]], list[str], Any, str]:
    services = open_services(settings)
    try:
        with services.sessions() as db:
            rows = db.scalars(select(TensorRecord).where(TensorRecord.run_id == run_id).order_by(TensorRecord.position))
            columns = [c.key for c in TensorRecord.__table__.columns if c.key not in _OWN]
            kept = [{c: getattr(r, c) for c in columns} for r in rows]
            notes = sorted(p.reason for p in db.scalars(select(ProblemRecord).where(ProblemRecord.run_id == run_id)))
            run = db.get_one(RunRecord, run_id)
            return kept, notes, run.module_tree, run.status
    finally:
        services.close()


def test_a_local_capture_stores_the_run_its_trace_file_would_give(settings: Settings, tmp_path: Path) -> None:
    model = tiny_llama()
    ids = input_ids()
    with torch.no_grad():
        names = list(summarize_forward(model, lambda: model(ids), modules="model.layers.1*").summaries)
    last = names[len(names) // 2]  # the rest left out: a note on the run and a scope on its tree
    with torch.no_grad(), record(model, level="op", values="summary", modules="model.layers.1*", last=last) as held:
        model(ids)
    stored = held.store("store", "memory", data_dir=settings.data_dir)
    assert stored.run_id is not None and stored.tensors == len(names) // 2 + 1

    folder = tmp_path / "trace"
    folder.mkdir()
    held.recorder.folder = folder
    written = held.recorder.write_tree()  # the JSON a capture through a server writes and uploads
    services = open_services(settings)
    try:
        ingested = services.ingestor.ingest("store", "file", [InputFile(folder, "trace")])
    finally:
        services.close()

    memory_rows, memory_notes, memory_tree, memory_status = _run(settings, stored.run_id)
    file_rows, file_notes, file_tree, file_status = _run(settings, ingested.run_id)
    assert memory_status == file_status == "ready"
    assert len(memory_rows) == len(file_rows) == stored.tensors
    assert memory_rows == file_rows  # names, order, layers, sources, shapes, dtypes, statistics, summaries
    assert memory_rows[-1]["name"] == last and all(r["sketch"] and r["sketch"]["hash"] for r in memory_rows)
    assert any(r["source"] for r in memory_rows)  # the ops' callers
    assert memory_tree == file_tree and memory_tree["scope"]["modules"] == ["model.layers.1*"]
    assert memory_notes == file_notes and any(f"up to {last}" in n for n in memory_notes)
    assert written.name.endswith("_debug_tree_FULL_TENSORS.json")


def test_a_summary_row_keeps_the_same_compact_summary_from_a_packed_or_a_listed_sample() -> None:

    t = torch.randn(4, 300, generator=torch.Generator().manual_seed(2))
    t[1, 3] = float("nan")
    summary = sketch(t, "fold64")
    rows = []
    for form in (summary.to_json(compact=True), summary.to_json()):  # packed: a capture's now; listed: older ones'
        traced = TraceTensor("Net.layers.0/softmax#1", "outputs", None, (4, 300), "float32", op="softmax", sketch=form)
        trace = Trace("Net", False, ModuleNode("Net"), [traced])
        rows.append(summary_row(7, 0, RunTrace("", "r/Net.json", trace), traced))
    assert rows[0]["sketch"] == rows[1]["sketch"] == summary.to_json(compact=True)
    assert rows[0]["layer"] == rows[1]["layer"] == 0 and rows[0]["nan_count"] == 1
