"""A full dump paired with a summary capture of the other side is judged on the summary ingest kept of each dumped
tensor: no chunk of the dump is read to judge it."""

from __future__ import annotations

import torch
from sqlalchemy import select, update
from tensor_debugger import capture
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.services import Services, open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store.models import PairRecord, TensorRecord

from tests.support.traces import MODEL_CLASS, WrittenTraces, input_ids, tiny_llama

CULPRIT = f"{MODEL_CLASS}.model.layers.1.mlp.down_proj_outputs"


def judged(services: Services, session_id: int) -> tuple[int, dict[str, PairRecord]]:
    """Plan and compute the session: the chunks read meanwhile, and its pairs by name."""
    before = services.store.chunk_reads
    services.plan(session_id)
    services.compute(session_id)
    reads = services.store.chunk_reads - before
    with services.sessions() as db:
        pairs = db.scalars(select(PairRecord).where(PairRecord.session_id == session_id)).all()
        return reads, {p.name: p for p in pairs}


def test_a_dump_against_a_summary_capture_is_judged_without_reading_the_dump(
    settings: Settings, hf_traces: WrittenTraces
) -> None:
    model = tiny_llama()
    with (
        torch.no_grad(),
        capture(model, "mixed", "reference", data_dir=settings.data_dir, values="summary") as result,
    ):
        model(input_ids())
    assert result.session_id is not None
    dump = hf_traces["perturbed"]  # transformers' debugger's files of the same model, layer 1's down_proj perturbed
    services = open_services(settings)
    try:
        ingested = services.ingestor.ingest("mixed", "candidate", [InputFile(dump, "trace")])
        with services.sessions() as db:
            rows = db.scalars(select(TensorRecord).where(TensorRecord.run_id == ingested.run_id)).all()
            assert rows and all(r.has_values and r.sketch is not None for r in rows)
        reads, pairs = judged(services, result.session_id)
        assert reads == 0  # the dump's summaries came from its rows, not from its chunk files
        assert pairs and all(p.summary is not None and p.summary["basis"] == "summary" for p in pairs.values())
        identical = [n for n, p in pairs.items() if p.summary is not None and p.summary["identical"]]
        # before the perturbed weight, the capture's hash is the dump's digest: bit-identical
        assert f"{MODEL_CLASS}.model.embed_tokens_outputs" in identical
        assert pairs[CULPRIT].status == "fail" and CULPRIT not in identical
        verdicts = {n: (p.status, p.summary) for n, p in pairs.items()}

        # The same rows without their summaries (as stored before ingest kept them): read back, the same verdicts.
        with services.sessions.begin() as db:
            db.execute(update(TensorRecord).where(TensorRecord.run_id == ingested.run_id).values(sketch=None))
            db.execute(update(PairRecord).where(PairRecord.session_id == result.session_id).values(summary=None))
        reads, pairs = judged(services, result.session_id)
        assert reads > 0
        assert {n: (p.status, p.summary) for n, p in pairs.items()} == verdicts
    finally:
        services.close()
