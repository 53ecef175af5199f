"""A candidate with fewer rows than the reference (its first rows only, a tensor-parallel shard alone, no rows at
all): the rows it has are compared, and said to be, but the reference rows it lacks were compared with nothing, so
the pair is no pass and the session is incomplete (exit 1), never "no divergence". A candidate with more rows (a
vocabulary padded to a multiple) leaves every reference element compared: it can pass, its extra rows said to be
unchecked."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from tensor_debugger.compare.reports.pair_reports import session_pairs
from tensor_debugger.services import open_services
from tensor_debugger.settings import Settings

from tests.support.cli_main import main_cli


def _runs(tmp_path: Path, reference: dict[str, NDArray[Any]], candidate: dict[str, NDArray[Any]]) -> tuple[Path, Path]:
    folders = tmp_path / "ref", tmp_path / "cand"
    for folder, tensors in zip(folders, (reference, candidate), strict=True):
        folder.mkdir()
        for name, values in tensors.items():
            np.save(folder / f"{name}.npy", values)
    return folders


def _compare(tmp_path: Path, ref: Path, cand: Path) -> tuple[int, dict[str, Any], str]:
    data = str(tmp_path / "data")
    done = main_cli("--data-dir", data, "compare", str(ref), str(cand), "--json")
    table = main_cli("--data-dir", data, "compare", str(ref), str(cand)).stdout
    return done.returncode, json.loads(done.stdout), table


def _values(shape: tuple[int, ...], seed: int) -> NDArray[Any]:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_a_candidate_with_the_first_rows_only_is_not_a_pass(tmp_path: Path) -> None:
    full = _values((6, 8), 1)
    code, out, table = _compare(tmp_path, *_runs(tmp_path, {"0_query": full}, {"0_query": full[:4]}))
    assert code == 1
    pair = out["pairs"][0]
    assert pair["status"] == "incomparable" and pair["stats"]["numel"] == 32 and pair["stats"]["max_abs_diff"] == 0
    said = (
        "compared 4 of the reference's 6 rows along dim 0: the candidate has 4, so 2 reference rows were not compared"
    )
    assert pair["error"] == f"not a pass: {said}; the rows compared are within tolerance"
    assert pair["alignment"] == "reference cut to its first 4 of 6 rows along dim 0 (2 reference rows not compared)"
    assert out["verdict"] == "incomplete" and out["coverage"]["not_compared"] == ["0_query"]
    assert "no divergence" not in table and f"  0_query: not a pass: {said}" in table
    # 4 of its rows were compared: not "nothing was compared"; the JSON holds the same numbers
    assert pair["reference_rows"] == {"kept": 4, "rows": 6, "axis": 0} and out["coverage"]["compared"] == 0
    assert "no pair was compared whole: 1 pair compared in part (4 of 6 rows)" in table.splitlines(), table
    assert "nothing was compared" not in table


def test_rows_that_differ_where_compared_fail(tmp_path: Path) -> None:
    full = _values((6, 8), 2)
    changed = full[:4].copy()
    changed[2, 5] += 1.0
    code, out, _ = _compare(tmp_path, *_runs(tmp_path, {"0_query": full}, {"0_query": changed}))
    pair = out["pairs"][0]
    assert code == 1 and out["verdict"] == "diverged" and pair["status"] == "fail"
    assert pair["stats"]["argmax"] == [2, 5] and pair["stats"]["mismatched"] == 1


def test_an_empty_candidate_is_incomparable(tmp_path: Path) -> None:
    runs = _runs(tmp_path, {"0_post_attn": _values((1, 6, 8), 3)}, {"0_post_attn": np.zeros((1, 0, 8), np.float32)})
    code, out, _ = _compare(tmp_path, *runs)
    pair = out["pairs"][0]
    assert code == 1 and out["verdict"] == "incomplete"
    assert pair["status"] == "incomparable" and pair["stats"] is None
    assert pair["alignment"] == "incomparable: [1, 6, 8] vs [1, 0, 8]"


def test_a_lone_tensor_parallel_shard_is_not_a_pass(tmp_path: Path) -> None:
    """The candidate run holds rank 0's shard only (rank 1's file never written, and no other tensor of rank 1 says
    the rank exists): its rows match the reference's first half, which is all that was compared."""
    full = _values((4, 8), 4)
    code, out, _ = _compare(tmp_path, *_runs(tmp_path, {"0_query": full}, {"0_query_rank0": full[:2]}))
    pair = out["pairs"][0]
    assert code == 1 and out["verdict"] == "incomplete" and pair["status"] == "incomparable"
    assert "compared 2 of the reference's 4 rows along dim 0" in pair["error"]


def test_a_padded_vocabulary_passes_its_extra_rows_said_unchecked(tmp_path: Path) -> None:
    weight = _values((6, 8), 5)
    padded = np.concatenate([weight, np.zeros((2, 8), np.float32)])  # 6 rows padded to a multiple of 8
    code, out, table = _compare(tmp_path, *_runs(tmp_path, {"lm_head": weight}, {"lm_head": padded}))
    pair = out["pairs"][0]
    assert code == 0 and out["verdict"] == "no_divergence"
    assert pair["status"] == "pass" and pair["error"] is None and pair["stats"]["numel"] == 48
    assert pair["alignment"] == "candidate cut to its first 6 of 8 rows along dim 0 (2 candidate rows not compared)"
    assert "no divergence" in table


def test_a_pass_stored_before_the_rule_reads_as_no_pass(tmp_path: Path) -> None:
    """A data dir whose pair was settled "pass" before a cut reference stopped passing: its reports say what the
    rule says now (the same verdict as a pair settled today), whatever its stored row holds."""
    full = _values((6, 8), 6)
    ref, cand = _runs(tmp_path, {"0_query": full}, {"0_query": full[:4]})
    code, out, _ = _compare(tmp_path, ref, cand)
    assert code == 1
    with sqlite3.connect(tmp_path / "data" / "metadata.sqlite3") as db:
        settled = "UPDATE pairs SET status = 'pass', error = NULL WHERE session_id = ?"
        stored = db.execute(settled, (out["session"]["id"],))
        assert stored.rowcount == 1
    services = open_services(Settings(data_dir=tmp_path / "data"))
    try:
        with services.sessions() as db:
            report = session_pairs(db, out["session"]["id"])
    finally:
        services.close()
    assert report.verdict == "incomplete" and [p.status for p in report.pairs] == ["incomparable"]
    assert report.pairs[0].error == out["pairs"][0]["error"]


def test_within_the_noise_floor_is_no_pass_either(tmp_path: Path) -> None:
    """The candidate's 4 rows differ from the reference's beyond tolerance but within the rerun's noise: the noise
    rule would pass them, and does not pass the pair, whose other 2 reference rows were compared with nothing."""
    full = _values((6, 8), 7)
    drift = np.full((6, 8), 0.01, np.float32)
    ref, cand = _runs(tmp_path, {"0_query": full}, {"0_query": (full + drift)[:4]})
    rerun = tmp_path / "rerun"
    rerun.mkdir()
    np.save(rerun / "0_query.npy", full - drift)
    data = str(tmp_path / "data")
    done = main_cli("--data-dir", data, "compare", str(ref), str(cand), "--noise", str(rerun), "--json")
    out = json.loads(done.stdout)
    pair = next(p for p in out["pairs"] if p["candidate"] == "cand")
    assert pair["rule"] == "noise" and pair["stats"]["mismatched"] > 0
    assert pair["status"] == "incomparable" and pair["error"].startswith("not a pass: compared 4 of the reference's 6")
    # passed by the noise rule, beside mismatch 100%: never said "within tolerance"
    assert pair["stats"]["mismatched"] == pair["stats"]["numel"]
    assert pair["error"].endswith("; the rows compared are within the noise floor")
    assert done.returncode == 1 and out["verdict"] == "incomplete"
