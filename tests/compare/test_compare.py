"""Comparisons end to end on real stores: `compare`, the cache, TP layouts, tolerances, overrides, slices."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from sqlalchemy import select
from tensor_debugger.cli.compare import run_compare
from tensor_debugger.cli.compare_output import compare_request
from tensor_debugger.compare.compute import pending as pending_pairs
from tensor_debugger.compare.compute.pending import ResultWriter, set_up
from tensor_debugger.compare.planning.plan import plan_session, refresh_session
from tensor_debugger.compare.planning.sides import views
from tensor_debugger.compare.reports.heatmap import build_heatmap, heatmap_svg
from tensor_debugger.compare.reports.pair_reports import pair_detail, session_pairs
from tensor_debugger.compare.reports.slices import SliceValues, parse_slice_request, read_slice
from tensor_debugger.demo.synthetic import STAGES, Plant, write_dump
from tensor_debugger.engine.alignment import Alignment
from tensor_debugger.engine.streaming import compare_stream
from tensor_debugger.engine.views import View
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.services import Services
from tensor_debugger.store import catalog
from tensor_debugger.store.models import PairOverrideRecord, PairRecord, SessionRecord

from tests.support.backends import BACKEND_FIXTURES, BACKENDS
from tests.support.dumps import make_tar, make_zip, seeded
from tests.support.postgres import DATABASES
from tests.support.s3 import STORES

PLANT = Plant(layer=1, stage="post_attn", index=(3, 7), offset=0.5)


def dumps(tmp_path: Path, plant: Plant | None = PLANT) -> tuple[Path, Path]:
    write_dump(tmp_path / "ref", layers=3, seed=4)
    write_dump(tmp_path / "cand", layers=3, seed=4, plant=plant)
    return make_tar(tmp_path / "ref", tmp_path / "reference.tar.gz", "w:gz"), make_zip(
        tmp_path / "cand", tmp_path / "candidate.zip"
    )


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A reference (a .tar.gz) and a candidate (a .zip) with PLANT in it: written once, only read by the tests."""
    return dumps(tmp_path_factory.mktemp("planted"))


def compare_json(
    services: Services, capsys: pytest.CaptureFixture[str], a: Path, b: Path, **kwargs: Any
) -> tuple[int, dict[str, Any]]:
    code = run_compare(
        services, compare_request(a, b, kwargs.get("name"), kwargs.get("rtol"), kwargs.get("atol")), True
    )
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(BACKEND_FIXTURES, BACKENDS, indirect=True)
def test_compare_finds_the_planted_first_divergence(
    services: Services, capsys: pytest.CaptureFixture[str], planted: tuple[Path, Path]
) -> None:
    reference, candidate = planted
    code, out = compare_json(services, capsys, reference, candidate, name="port vs ref")
    assert code == 1
    assert out["session"]["name"] == "port vs ref"
    assert out["session"]["url"].endswith(f"/sessions/{out['session']['id']}")
    names = [p["name"] for p in out["pairs"]]
    assert names == [f"{layer}_{stage}" for layer in range(3) for stage in STAGES]  # execution order
    single = [
        {"dim": 0, "name": None, "size": 16, "ranges": [[3, 3]]},
        {"dim": 1, "name": None, "size": 32, "ranges": [[7, 7]]},
    ]
    assert out["first_divergence"] == {
        "name": "1_post_attn",
        "layer": 1,
        "stage": "post_attn",
        "where": single,
        "unmatched_before": [],
        "basis": None,
        "summary_reason": None,
        "candidate_only_before": [],
        "first_changed": None,
        "in_execution_order": True,
        "first_changed_on_summaries": False,
        "source_note": None,
        "crossed_before": [],
        "lowered_first": None,
        "candidate_early_before": [],
        "candidate_holds": None,
        "find_divergence_checks": [],
        "outputs_agree": False,
        "order_note": None,
        "paired_by": None,
        "candidate_name": None,
        "not_compared_before": [],
        "statistics_before": 0,
    }
    first = next(p for p in out["pairs"] if p["name"] == "1_post_attn")
    assert first["status"] == "fail" and first["stats"]["argmax"] == [3, 7]
    assert first["stats"]["max_abs_diff"] == pytest.approx(0.5, abs=1e-6)
    assert first["stats"]["mismatched"] == 1 and first["stats"]["numel"] == 16 * 32
    assert first["a"] == {"name": "1_post_attn", "shape": [16, 32], "dtype": "float32", "source": None}
    before = [p for p in out["pairs"] if (p["layer"], STAGES.index(p["stage"])) < (1, STAGES.index("post_attn"))]
    assert before and all(p["status"] == "pass" for p in before)
    assert out["unmatched"] == {"a": [], "b": []}


def test_identical_runs_pass_and_exit_zero(
    services: Services, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reference, candidate = dumps(tmp_path, plant=None)
    code, out = compare_json(services, capsys, reference, candidate)
    assert code == 0 and out["first_divergence"] is None
    assert {p["status"] for p in out["pairs"]} == {"pass"}


def test_unusable_input_exits_two(
    services: Services, tmp_path: Path, capsys: pytest.CaptureFixture[str], planted: tuple[Path, Path]
) -> None:
    reference, _ = planted
    junk = tmp_path / "junk.txt"
    junk.write_text("no tensors")
    code, out = compare_json(services, capsys, reference, junk)
    assert code == 2 and out["problems"][0]["file"] == str(junk)
    with services.sessions() as db:
        assert catalog.list_sessions(db) == []


@pytest.mark.parametrize(BACKEND_FIXTURES, BACKENDS, indirect=True)
def test_running_again_recomputes_nothing(
    services: Services, capsys: pytest.CaptureFixture[str], planted: tuple[Path, Path]
) -> None:
    reference, candidate = planted
    compare_json(services, capsys, reference, candidate, name="first")
    reads_before = services.store.chunk_reads
    code, out = compare_json(services, capsys, reference, candidate, name="first")
    assert code == 1 and out["session"]["name"] == "first (2)"
    assert services.store.chunk_reads == reads_before  # every statistic came from the cache
    assert out["first_divergence"]["name"] == "1_post_attn"
    with services.sessions() as db:  # reopening a session reads no chunk either
        session_pairs(db, out["session"]["id"])
    assert services.store.chunk_reads == reads_before


def test_tolerances_change_verdicts(
    services: Services, capsys: pytest.CaptureFixture[str], planted: tuple[Path, Path]
) -> None:
    reference, candidate = planted
    code, out = compare_json(services, capsys, reference, candidate, atol=1.0)
    assert code == 0 and out["first_divergence"] is None
    session_id = out["session"]["id"]
    with services.sessions.begin() as db:
        catalog.set_tolerances(catalog.get_session(db, session_id), None, 1e-3)
    refresh_session(services.context, session_id)
    services.compute(session_id)
    with services.sessions() as db:
        report = session_pairs(db, session_id)
    assert report.first_divergence is not None and report.first_divergence.name == "1_post_attn"
    statuses = {p.name: p.status for p in report.pairs}
    assert statuses["1_post_attn"] == "fail" and statuses["1_pre_mlp"] == "fail"  # 0.005 echo > 1e-3
    assert statuses["1_post_ln_pre_attn"] == "pass"


def save_all(folder: Path, tensors: dict[str, torch.Tensor]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, tensor in tensors.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        torch.save(tensor, folder / f"{name}.pth")
    return folder


def test_tp8_against_tp1_layouts(services: Services, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    full = seeded((76, 8, 64), 11)
    mlp = seeded((76, 512), 12)
    values = seeded((76, 8, 64), 13)
    tp1 = save_all(
        tmp_path / "tp1", {"0_query": full, "0_post_mlp": mlp, "0_value": values, "0_scaling": torch.tensor(0.125)}
    )
    permuted = full.permute(1, 0, 2).unsqueeze(0).clone()  # [1, 8, 76, 64]
    permuted[0, 6, 40, 9] += 0.75
    extra = torch.cat([mlp, seeded((4, 512), 14)])  # one rank's four extra rows
    shards = {f"rank{k}/0_value": values[:, 2 * k : 2 * k + 2, :].clone() for k in range(4)}
    shards["rank2/0_value"][70, 1, 63] -= 2.0
    tp8 = save_all(
        tmp_path / "tp8", {"0_query": permuted, "0_post_mlp": extra, **shards, "0_scaling": torch.tensor(0.125)}
    )
    code, out = compare_json(services, capsys, tp1, tp8)
    assert code == 1
    pairs = {p["name"]: p for p in out["pairs"]}
    query = pairs["0_query"]
    assert query["alignment"].startswith("candidate size-1 dims dropped") and "permuted [1, 0, 2]" in query["alignment"]
    assert query["stats"]["argmax"] == [40, 6, 9] and query["stats"]["mismatched"] == 1
    assert query["stats"]["max_abs_diff"] == pytest.approx(0.75, abs=1e-6)
    mlp_pair = pairs["0_post_mlp"]
    # the candidate's extra rows are not compared (said so), every reference element is: a pass stands
    assert mlp_pair["status"] == "pass" and mlp_pair["error"] is None
    cut = "candidate cut to its first 76 of 80 rows along dim 0 (4 candidate rows not compared)"
    assert cut in mlp_pair["alignment"]
    value_pair = pairs["0_value"]
    assert value_pair["b"]["shape"] == [76, 8, 64] and "concatenated along dim 1" in value_pair["alignment"]
    assert value_pair["stats"]["argmax"] == [70, 5, 63] and value_pair["stats"]["max_abs_diff"] == pytest.approx(2.0)
    assert pairs["0_scaling"]["status"] == "pass"
    # statistics equal a float64 reference computed in memory
    a64 = full.double().numpy()
    b64 = permuted[0].permute(1, 0, 2).double().numpy()
    d = np.abs(a64 - b64)
    assert query["stats"]["mean_abs_diff"] == pytest.approx(d.mean(), rel=1e-12)
    assert query["stats"]["mse"] == pytest.approx((d**2).mean(), rel=1e-12)
    cosine = float((a64 * b64).sum() / np.sqrt((a64**2).sum() * (b64**2).sum()))
    assert query["stats"]["cosine"] == pytest.approx(cosine, rel=1e-12)
    # where the largest difference lies in each run's own tensors
    with services.sessions() as db:
        detail = pair_detail(db, services.context, value_pair_id(services, out, "0_value"))
    assert detail.argmax is not None and detail.argmax.aligned == [70, 5, 63]
    assert (detail.argmax.a.tensor, detail.argmax.a.index) == ("0_value", [70, 5, 63])
    assert (detail.argmax.b.tensor, detail.argmax.b.index) == ("rank2/0_value", [70, 1, 63])


def value_pair_id(services: Services, out: dict[str, Any], name: str) -> int:
    with services.sessions() as db:
        report = session_pairs(db, out["session"]["id"])
    return next(p.id for p in report.pairs if p.name == name)


def test_incomparable_and_unmatched_are_listed(
    services: Services, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = save_all(tmp_path / "a", {"0_query": seeded((3, 5), 1), "0_key": seeded((2,), 2), "only_a": seeded((9,), 3)})
    b = save_all(tmp_path / "b", {"0_query": seeded((4, 4), 1), "0_key": seeded((2,), 2), "only_b": seeded((8,), 3)})
    code, out = compare_json(services, capsys, a, b)
    assert code == 1
    query = next(p for p in out["pairs"] if p["name"] == "0_query")
    assert query["status"] == "incomparable" and "[3, 5] vs [4, 4]" in query["alignment"]
    assert out["unmatched"] == {"a": ["only_a"], "b": ["only_b"]}
    assert out["first_divergence"] is None  # nothing failed its tolerance; the incomparable pair still exits 1


def test_nan_is_never_hidden(services: Services, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    clean = seeded((8, 8), 5)
    broken = clean.clone()
    broken[2, 3] = float("nan")
    broken[4, 4] = float("inf")
    code, out = compare_json(
        services,
        capsys,
        save_all(tmp_path / "a", {"0_post_mlp": clean}),
        save_all(tmp_path / "b", {"0_post_mlp": broken}),
    )
    stats = out["pairs"][0]["stats"]
    assert code == 1 and (stats["nan_a"], stats["nan_b"], stats["inf_a"], stats["inf_b"]) == (0, 1, 0, 1)
    assert stats["cosine"] == "nan" and stats["max_abs_diff"] == "nan" and stats["argmax"] == [2, 3]
    assert stats["mismatched"] == 2


def test_identical_upload_in_another_session_reads_no_chunk(services: Services, tmp_path: Path) -> None:
    a = save_all(tmp_path / "a", {"0_query": seeded((64, 64), 1)})
    b = save_all(tmp_path / "b", {"0_query": seeded((64, 64), 2)})
    for name in ("one", "two"):
        services.ingestor.ingest(name, "ref", [InputFile(a, "a")])
        result = services.ingestor.ingest(name, "cand", [InputFile(b, "b")])
        plan_session(services.context, result.session_id)
        before = services.store.chunk_reads
        services.compute(result.session_id)
        reads = services.store.chunk_reads - before
        assert reads > 0 if name == "one" else reads == 0


@pytest.mark.parametrize("database_url", DATABASES, indirect=True)
def test_the_same_comparison_twice_in_one_batch_is_computed_once(services: Services, tmp_path: Path) -> None:
    """Two sessions of identical dumps, both pending at once: the second pair waits for the first pair's result
    instead of reading every chunk again."""
    a = save_all(tmp_path / "a", {"0_query": seeded((64, 64), 1)})
    b = save_all(tmp_path / "b", {"0_query": seeded((64, 64), 2)})
    sessions = []
    for name in ("one", "two"):
        services.ingestor.ingest(name, "ref", [InputFile(a, "a")])
        sessions.append(services.ingestor.ingest(name, "cand", [InputFile(b, "b")]).session_id)
        plan_session(services.context, sessions[-1])
    before = services.store.chunk_reads
    assert services.compute() == 2
    # one chunk of each run, and again for where inside the failing pair: once for both pairs, not per pair
    assert services.store.chunk_reads - before == 4
    with services.sessions() as db:
        pairs = db.scalars(select(PairRecord).where(PairRecord.session_id.in_(sessions))).all()
        assert [p.status for p in pairs] == ["fail", "fail"] and pairs[0].result_id == pairs[1].result_id


def two_pairs(services: Services, tmp_path: Path) -> tuple[int, list[PairRecord]]:
    """A session whose pair 0_query fails (the candidate is off by one) and 0_key passes (identical)."""
    x, y = seeded((64, 64), 1), seeded((64, 64), 2)
    a = save_all(tmp_path / "a", {"0_query": x, "0_key": y})
    b = save_all(tmp_path / "b", {"0_query": x + 1.0, "0_key": y.clone()})
    services.ingestor.ingest("two", "ref", [InputFile(a, "a")])
    session_id = services.ingestor.ingest("two", "cand", [InputFile(b, "b")]).session_id
    plan_session(services.context, session_id)
    with services.sessions() as db:
        return session_id, list(
            db.scalars(select(PairRecord).where(PairRecord.session_id == session_id).order_by(PairRecord.id))
        )


def test_a_result_goes_only_to_a_pair_that_still_has_its_key(services: Services, tmp_path: Path) -> None:
    """Replanned while its pairs computed (0_query unpaired, the tolerances changed), a session keeps 0_key's pair id
    but not its key: a result is given only to a pair whose tensors, alignment and tolerances still make its key,
    and the result of a pair planned away goes to no other pair."""
    session_id, pairs = two_pairs(services, tmp_path)
    assert [p.name for p in pairs] == ["0_query", "0_key"]
    jobs, _ = set_up(services.context, [p.id for p in pairs])
    results = list(compare_stream(jobs, services.context.pool))
    with services.sessions.begin() as db:  # meanwhile the user unpairs 0_query and loosens the tolerances
        db.add(
            PairOverrideRecord(
                session_id=session_id, run_b_id=pairs[0].run_b_id, action="unpair", a_name="0_query", b_name="0_query"
            )
        )
        catalog.set_tolerances(db.get_one(SessionRecord, session_id), 1e-3, 1e-3, None)
    plan_session(services.context, session_id)
    writer = ResultWriter(services.context)
    for work, result in results:
        writer.add(work, result, [work.pair_id])
    writer.flush()
    with services.sessions() as db:
        (replanned,) = db.scalars(select(PairRecord).where(PairRecord.session_id == session_id)).all()
        assert (replanned.id, replanned.name, replanned.status, replanned.result_id) == (
            pairs[1].id,
            "0_key",
            "pending",
            None,
        )
    before = services.store.chunk_reads
    services.compute(session_id)  # under the new tolerances: computed again
    assert services.store.chunk_reads > before
    with services.sessions() as db:
        assert db.get_one(PairRecord, pairs[1].id).status == "pass"


def test_results_are_written_within_a_tick(services: Services, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first result is written at once; one that arrives soon after waits at most FLUSH_SECONDS, for the
    next result or the next tick, not for the end of the computation."""
    monkeypatch.setattr(pending_pairs, "FLUSH_SECONDS", 60.0)  # "soon after", however slow this machine is
    _, pairs = two_pairs(services, tmp_path)
    jobs, _ = set_up(services.context, [p.id for p in pairs])
    results = list(compare_stream(jobs, services.context.pool))
    writer = ResultWriter(services.context)

    def statuses() -> list[str]:
        with services.sessions() as db:
            return [db.get_one(PairRecord, p.id).status for p in pairs]

    writer.add(results[0][0], results[0][1], [results[0][0].pair_id])
    writer.add(results[1][0], results[1][1], [results[1][0].pair_id])
    assert statuses() == ["fail", "pending"]
    writer.tick()
    assert statuses() == ["fail", "pending"]  # the last batch was written less than FLUSH_SECONDS ago: not yet
    monkeypatch.setattr(pending_pairs, "FLUSH_SECONDS", 0.0)  # and now it was
    writer.tick()
    assert statuses() == ["fail", "pass"]


def stored_pair_views(
    services: Services, tmp_path: Path, a_tensor: torch.Tensor, b_tensor: torch.Tensor
) -> tuple[View, View, Alignment]:
    """Ingest one tensor per run as `0_post_mlp`, pair them, and hand back the pair's lazy views."""
    a = save_all(tmp_path / "a", {"0_post_mlp": a_tensor})
    b = save_all(tmp_path / "b", {"0_post_mlp": b_tensor})
    services.ingestor.ingest("views", "ref", [InputFile(a, "a")])
    result = services.ingestor.ingest("views", "cand", [InputFile(b, "b")])
    plan_session(services.context, result.session_id)
    with services.sessions() as db:
        pair = db.scalars(select(PairRecord).where(PairRecord.session_id == result.session_id)).one()
        return views(services.store, db, pair)


def rows(values: SliceValues) -> list[Any]:
    """A window's values along its first free dimension (a 0-d tensor's window is one value, not a list)."""
    assert isinstance(values, list), values
    return values


@pytest.mark.parametrize("store_url", STORES, indirect=True)
def test_slices_read_only_the_chunks_they_need(services: Services, tmp_path: Path) -> None:
    big = torch.arange(512 * 4096, dtype=torch.float32).reshape(512, 4096)  # 8 MiB: 8 chunks of 64 rows
    other = big.clone()
    other[300, 1000] = -1.0
    view_a, view_b, alignment = stored_pair_views(services, tmp_path, big, other)
    request = parse_slice_request(alignment.shape, "300,:", "998", "4")
    before = services.store.chunk_reads
    window = read_slice(view_a, view_b, request)
    assert services.store.chunk_reads - before == 2  # one chunk per run
    assert window.a == [float(300 * 4096 + c) for c in range(998, 1002)]
    assert rows(window.diff)[2] == pytest.approx(-1.0 - (300 * 4096 + 1000))
    square = read_slice(view_a, view_b, parse_slice_request(alignment.shape, ":,:", "60,0", "8,64"))
    assert len(rows(square.a)) == 8 and len(rows(square.a)[0]) == 64


def test_slices_write_nan_and_infinities_as_text(services: Services, tmp_path: Path) -> None:
    a = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    b = a.clone()
    b[1, 1], b[1, 2], b[2, 3] = float("nan"), float("inf"), float("-inf")
    view_a, view_b, alignment = stored_pair_views(services, tmp_path, a, b)
    window = read_slice(view_a, view_b, parse_slice_request(alignment.shape, ":,:", "0,0", "3,4"))
    assert rows(window.a)[1] == [4.0, 5.0, 6.0, 7.0]  # all finite: the values as they are
    assert rows(window.b)[1] == [4.0, "nan", "inf", 7.0] and rows(window.b)[2][3] == "-inf"
    assert rows(window.diff)[1][1] == "nan" and rows(window.diff)[0] == [0.0, 0.0, 0.0, 0.0]


def test_heatmap_max_pools_so_a_spike_cannot_hide(services: Services, tmp_path: Path) -> None:
    base = seeded((3, 300, 500), 1)
    spiked = base.clone()
    spiked[1, 211, 377] += 5.0
    spiked[1, 7, 3] = float("nan")
    view_a, view_b, _ = stored_pair_views(services, tmp_path, base, spiked)
    heat = build_heatmap(view_a, view_b, (1, None, None))
    assert heat.cells.shape == (64, 96) and heat.shape == (300, 500)
    row = next(r for r in range(64) if heat.row_edges[r] <= 211 < heat.row_edges[r + 1])
    col = next(c for c in range(96) if heat.col_edges[c] <= 377 < heat.col_edges[c + 1])
    assert heat.cells[row, col] == pytest.approx(5.0, abs=1e-5)  # the spike survives downsampling
    assert heat.signs[row, col] == 1  # the candidate is higher there: drawn red
    assert np.isnan(heat.cells[1, 0])  # the NaN is shown, not averaged away
    assert np.nansum(heat.cells) == pytest.approx(5.0, abs=1e-5)
    other = build_heatmap(view_a, view_b, (0, None, None))
    assert np.nanmax(other.cells) == 0.0
    svg = heatmap_svg(heat)
    assert svg.count("<rect") == 64 * 96 + 21 and "largest difference (candidate − reference) NaN" in svg  # + the scale
