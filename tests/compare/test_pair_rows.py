"""Pair reports read from light rows decoded by msgspec: the same statistics as the stored JSON says, with or
without the process's cache of decoded statistics (and with one too small to hold them all)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select
from tensor_debugger.compare.planning.plan import plan_session
from tensor_debugger.compare.reports.pair_reports import session_pairs
from tensor_debugger.compare.reports.pair_rows import StatsCache
from tensor_debugger.compare.reports.pair_stats import PairStatsSummary
from tensor_debugger.demo.synthetic import Plant, write_dump
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.services import Services
from tensor_debugger.store.models import ComparisonResultRecord, PairRecord
from tensor_debugger.store.reports import PairStatus


def test_reports_decode_the_stored_statistics_with_or_without_the_cache(services: Services, tmp_path: Path) -> None:
    write_dump(tmp_path / "ref", layers=2, seed=3)
    write_dump(tmp_path / "cand", layers=2, seed=3, plant=Plant(layer=1, stage="post_attn", index=(2, 5), offset=0.5))
    services.ingestor.ingest("rows", "reference", [InputFile(tmp_path / "ref", "ref")])
    session_id = services.ingestor.ingest("rows", "candidate", [InputFile(tmp_path / "cand", "cand")]).session_id
    plan_session(services.context, session_id)
    services.compute(session_id)
    with services.sessions() as db:
        stored = {r.id: r.stats for r in db.scalars(select(ComparisonResultRecord))}
        result_of = dict(db.execute(select(PairRecord.id, PairRecord.result_id)).all())
        plain = session_pairs(db, session_id, modules=True)
        cache = StatsCache()
        cached = [session_pairs(db, session_id, modules=True, cache=cache) for _ in range(2)]
        small = session_pairs(db, session_id, modules=True, cache=StatsCache(limit=3))
    assert len(stored) > 3 and len(cache.entries) == len(stored)
    assert cached == [plain, plain] and small == plain
    assert plain.first_divergence is not None and plain.first_divergence.name == "1_post_attn"
    assert {p.status for p in plain.pairs} == {PairStatus.PASS, PairStatus.FAIL}
    # each pair's statistics are its stored JSON's, field for field (NaN and infinities stay "nan", "inf")
    for pair in plain.pairs:
        assert pair.stats == PairStatsSummary.from_json(stored[result_of[pair.id]])
