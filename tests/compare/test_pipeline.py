"""The compare pipeline: the candidate's tensors compared while it ingests, with the same answer as comparing after
both runs are stored, and `--fail-fast` stopping at the first divergence in execution order."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, func, select
from tensor_debugger.cli.compare import run_compare
from tensor_debugger.cli.compare_output import compare_request
from tensor_debugger.compare.pipeline import compare_runs
from tensor_debugger.compare.planning.plan import plan_session
from tensor_debugger.compare.planning.requests import CompareRequest
from tensor_debugger.compare.reports.compare_report import CompareReport, to_json
from tensor_debugger.compare.reports.contract import compare_report
from tensor_debugger.compare.reports.pair_reports import session_pairs
from tensor_debugger.demo.synthetic import Plant, write_dump
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.services import Services, open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store.models import ComparisonResultRecord, PairRecord, SessionRecord, TensorRecord

from tests.support.dumps import make_zip


def runs(tmp_path: Path, layers: int, plant: Plant) -> tuple[Path, Path]:
    write_dump(tmp_path / "ref", layers=layers, seed=2)
    write_dump(tmp_path / "cand", layers=layers, seed=2, plant=plant)
    return make_zip(tmp_path / "ref", tmp_path / "ref.zip"), make_zip(tmp_path / "cand", tmp_path / "cand.zip")


def request(a: Path, b: Path, **kwargs: Any) -> CompareRequest:
    return CompareRequest(a, b, str(a), str(b), **kwargs)


def comparable(report: CompareReport) -> list[tuple[Any, ...]]:
    return [(p.name, p.status, p.alignment, p.stats) for p in report.pairs]


def test_the_candidate_is_compared_while_it_ingests_with_the_same_answer(services: Services, tmp_path: Path) -> None:
    a, b = runs(tmp_path, layers=2, plant=Plant(layer=1, stage="post_attn", index=(3, 7), offset=0.5))
    events: list[tuple[str, int, int]] = []
    outcome = compare_runs(
        services.ingestor,
        services.context,
        services.compute,
        request(a, b),
        "http://here",
        lambda step, done, total: events.append((step, done, total)),
    )
    assert outcome.exit_code == 1 and to_json(outcome.payload)["first_divergence"]["name"] == "1_post_attn"
    pairs = len(outcome.payload.pairs)
    assert pairs >= 20
    # every pair was compared before the candidate was ready: after the plan there was nothing left to compute
    # (pairs of identical comparisons, such as the same scalar in every layer, share one result)
    with services.sessions() as db:
        results = db.scalar(select(func.count()).select_from(ComparisonResultRecord))
        assert db.scalar(select(func.count(PairRecord.result_id.distinct()))) == results
    assert max(done for step, done, _ in events if step == "early") == results
    assert not [e for e in events if e[0] == "compare"]

    # the same runs stored first and compared after, as before the pipeline, in another data dir
    other = open_services(Settings(data_dir=tmp_path / "other", demo=False))
    try:
        for label, path in (("ref.zip", a), ("cand.zip", b)):
            ingested = other.ingestor.ingest("after", label, [InputFile(path, str(path))])
        plan_session(other.context, ingested.session_id)
        assert other.compute(ingested.session_id) == pairs
        with other.sessions() as db:
            report = session_pairs(db, ingested.session_id, modules=True)
        after = compare_report(ingested.session_id, "after", "", report, [])
    finally:
        other.close()
    assert comparable(outcome.payload) == comparable(after)
    assert outcome.payload.first_divergence == after.first_divergence


def test_fail_fast_stops_at_the_first_divergence(
    services: Services, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = runs(tmp_path, layers=5, plant=Plant(layer=0, stage="post_attn", index=(3, 7), offset=1.0))
    code = run_compare(services, compare_request(a, b, "fail fast", None, None, fail_fast=True), False)
    out = capsys.readouterr().out
    assert code == 1
    assert "FIRST DIVERGENCE: 0_post_attn" in out
    assert "stopped at the first divergence (--fail-fast)" in out
    with services.sessions() as db:
        session_id = db.scalar(select(PairRecord.session_id).limit(1))
        assert session_id is not None
        report = session_pairs(db, session_id)
        statuses = [str(p.status) for p in report.pairs]
        first = next(n for n, p in enumerate(report.pairs) if p.name == "0_post_attn")
        assert statuses[: first + 1] == ["pass"] * first + ["fail"]  # everything before the divergence known
        left = [n for n, p in enumerate(report.pairs) if str(p.status) == "pending"]
        assert left and min(left) > first  # what comes after is left pending: whole, resumable
        assert all(report.pairs[n].stats is None for n in left)
        assert report.first_divergence is not None and report.first_divergence.name == "0_post_attn"
    # what was left is computed by whoever computes pending pairs next (a server's worker), as after any stop
    services.compute(session_id)
    with services.sessions() as db:
        report = session_pairs(db, session_id)
        assert not [p for p in report.pairs if str(p.status) == "pending"]
        assert report.first_divergence is not None and report.first_divergence.name == "0_post_attn"


def test_a_run_refused_while_the_others_ingest_leaves_nothing(services: Services, tmp_path: Path) -> None:
    a, _ = runs(tmp_path, layers=1, plant=Plant(layer=0, stage="post_attn", index=(0, 0), offset=0.5))
    bad = tmp_path / "bad.pth"
    bad.write_bytes(b"definitely not a tensor")
    outcome = compare_runs(services.ingestor, services.context, services.compute, request(a, bad), "http://here")
    assert outcome.exit_code == 2
    assert "no tensors" in str(outcome.payload.error)
    assert [p.file for p in outcome.payload.problems] == [str(bad)]
    with services.sessions() as db:  # the session, the reference ingested beside the refused run, and its arrays
        assert db.scalar(select(func.count()).select_from(TensorRecord)) == 0
        assert db.scalar(select(func.count()).select_from(SessionRecord)) == 0
    assert not [
        p for p in (services.settings.data_dir / "arrays" / "runs").rglob("zarr.json") if p.parent.name.isdigit()
    ]


def test_results_compared_early_are_written_in_batches(services: Services, tmp_path: Path) -> None:
    """The early comparisons write their results a batch per transaction (one per result cost a first compare a
    tenth of a second), yet every one is cached before its run's ingest goes on to the plan (`wait_for`)."""
    a, b = runs(tmp_path, layers=3, plant=Plant(layer=2, stage="post_mlp", index=(1, 2), offset=0.5))
    commits: list[str] = []

    def committed(_connection: object) -> None:
        commits.append(threading.current_thread().name)

    event.listen(services.engine, "commit", committed)
    try:
        outcome = compare_runs(services.ingestor, services.context, services.compute, request(a, b), "http://here")
    finally:
        event.remove(services.engine, "commit", committed)
    assert outcome.exit_code == 1 and to_json(outcome.payload)["first_divergence"]["name"] == "2_post_mlp"
    with services.sessions() as db:
        results = db.scalar(select(func.count()).select_from(ComparisonResultRecord))
        assert results is not None and results >= 20
        assert db.scalar(select(func.count(PairRecord.result_id.distinct()))) == results  # all cached before the plan
        assert not db.scalar(select(func.count()).where(PairRecord.status == "pending"))
    assert 0 < commits.count("compare-early") < results / 2


@pytest.mark.parametrize(("fail_fast", "earlier"), [(False, False), (True, False), (False, True)])
def test_a_session_name_another_compare_takes_meanwhile_is_not_shared(
    services: Services, tmp_path: Path, fail_fast: bool, earlier: bool
) -> None:
    """Two `compare --name nightly` at once: each found "nightly" free, and both landed in one session of four runs
    (the first reported the other's runs as its candidates; the second, a clash of labels or "no tensor could be
    paired"). Now a compare's first run makes its session, and where another command made one of that name since
    it was found free, the compare takes the next free name. The other command's session is left as it was.
    `earlier`: a session "nightly" was there before, so "nightly (2)" was found free and taken meanwhile: the next is
    "nightly (3)", not "nightly (2) (2)"."""
    a, b = runs(tmp_path, layers=1, plant=Plant(layer=0, stage="post_attn", index=(1, 2), offset=0.5))
    if earlier:
        services.ingestor.begin("nightly", "before", ["before"])
    taken = "nightly (2)" if earlier else "nightly"
    armed = [True]

    def other_compare_first(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if armed[0] and statement.startswith("UPDATE sessions SET name"):  # the first run's begin, name found free
            armed[0] = False
            other = threading.Thread(target=lambda: services.ingestor.begin(taken, "other", ["other"]))
            other.start()
            other.join()

    engine = services.sessions.kw["bind"]
    event.listen(engine, "before_cursor_execute", other_compare_first)
    try:
        outcome = compare_runs(
            services.ingestor,
            services.context,
            services.compute,
            request(a, b, name="nightly", fail_fast=fail_fast),
            "http://here",
            None,
        )
    finally:
        event.remove(engine, "before_cursor_execute", other_compare_first)
    assert not armed[0]
    payload = to_json(outcome.payload)
    assert outcome.exit_code == 1 and payload["first_divergence"]["name"] == "0_post_attn"
    made = "nightly (3)" if earlier else "nightly (2)"
    assert payload["session"]["name"] == made
    with services.sessions() as db:
        sessions = {s.name: sorted(r.label for r in s.runs) for s in db.scalars(select(SessionRecord))}
    assert sessions == {taken: ["other"], made: ["cand.zip", "ref.zip"]} | ({"nightly": ["before"]} if earlier else {})
