"""TENSOR_DEBUGGER_WORKERS: how many threads compare and ingest, by default the CPUs this process may run on; every
result (verdicts, statistics, digests, summaries, stored chunks, slices) is the same for any number."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import blake3
import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from sqlalchemy import select
from tensor_debugger.compare.planning.sides import views
from tensor_debugger.compare.reports.heatmap import build_heatmap
from tensor_debugger.compare.reports.slices import parse_slice_request, read_slice
from tensor_debugger.ingest.writer import SerialLane, WritePools, digest_header
from tensor_debugger.services import open_services
from tensor_debugger.settings import Settings, available_cpus
from tensor_debugger.store.dtypes import parse_dtype
from tensor_debugger.store.identity import MARKER
from tensor_debugger.store.models import ComparisonResultRecord, PairRecord, TensorRecord

from tests.support.cli_main import main_cli
from tests.support.dumps import seeded

BIG = (600, 4096)  # 2.5M float32 values: three comparison blocks, and many ingest blocks of small chunks
SMALL_CHUNKS = "16384"  # bytes per stored chunk: blocks of 256 KiB, so every tensor is many blocks


def test_the_default_is_the_cpus_this_process_may_run_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings(data_dir=tmp_path).workers == 0
    assert Settings(data_dir=tmp_path).threads == len(os.sched_getaffinity(0)) == available_cpus()
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 2, 5})  # a narrowed mask
    assert Settings(data_dir=tmp_path).threads == 3
    assert Settings.from_environ({"TENSOR_DEBUGGER_WORKERS": "5"}, data_dir=tmp_path).threads == 5
    assert Settings.from_environ({"TENSOR_DEBUGGER_WORKERS": "5"}, data_dir=tmp_path, workers=1).threads == 1
    services = open_services(Settings(data_dir=tmp_path / "data", demo=False))
    try:
        assert services.context.workers == 3  # the pool is sized from the settings, not fixed
    finally:
        services.close()


def test_without_an_affinity_mask_every_cpu_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "sched_getaffinity")
    monkeypatch.setattr(os, "cpu_count", lambda: 7)
    assert available_cpus() == 7


@pytest.mark.parametrize(
    ("env", "flag", "message"),
    [
        (
            {"TENSOR_DEBUGGER_WORKERS": "-1"},
            [],
            "setting workers (TENSOR_DEBUGGER_WORKERS, --workers) must be 0 (one "
            "per available CPU) or a positive number of threads, got -1",
        ),
        ({"TENSOR_DEBUGGER_WORKERS": "many"}, [], "TENSOR_DEBUGGER_WORKERS='many' is not a valid int"),
        ({}, ["--workers", "-3"], "must be 0 (one per available CPU) or a positive number of threads, got -3"),
    ],
)
def test_a_bad_number_of_workers_is_a_clear_error(
    tmp_path: Path, env: dict[str, str], flag: list[str], message: str
) -> None:
    done = main_cli("--data-dir", str(tmp_path), *flag, "sessions", env=env)
    assert done.returncode == 2
    assert message in done.stderr


def test_the_flag_is_parsed_as_a_number(tmp_path: Path) -> None:
    done = main_cli("--data-dir", str(tmp_path), "--workers", "two", "sessions")
    assert done.returncode == 2 and "argument --workers: invalid int value: 'two'" in done.stderr


def test_a_serial_lane_runs_in_order_beside_other_work() -> None:
    pools = WritePools.open(3)
    try:
        seen: list[int] = []
        lane = SerialLane(pools.pool)

        def appender(n: int) -> Callable[[], None]:
            return lambda: seen.append(n)

        futures = [lane.submit(appender(n)) for n in range(200)]
        others = [pools.pool.submit(sum, range(n)) for n in range(50)]
        for future in futures:
            future.result()
        assert seen == list(range(200))
        assert [f.result() for f in others] == [sum(range(n)) for n in range(50)]
    finally:
        pools.close()


def write_run(folder: Path, noise: float) -> dict[str, torch.Tensor]:
    """One run: big float32 tensors (one per file), a safetensors file of several tensors of several dtypes (its
    tensors are copied overlapping), and an integer tensor. `noise` perturbs the candidate."""
    folder.mkdir()
    written: dict[str, torch.Tensor] = {}
    for layer in range(2):
        t = seeded(BIG, layer)
        if noise:
            t = t + noise * seeded(BIG, 100 + layer)
            t[layer * 7, 11:19] += 1.0
        torch.save(t, folder / f"{layer}_post_mlp.pth")
        written[f"{layer}_post_mlp"] = t
    group = {
        "query": seeded((96, 513), 3),
        "key": seeded((64, 1000), 4, torch.bfloat16),
        "value": seeded((3, 5, 7), 5, torch.float16),
        "scale": seeded((), 6),
    }
    if noise:
        group = {
            k: (v.float() + noise * seeded(tuple(v.shape), 200 + n)).to(v.dtype)
            for n, (k, v) in enumerate(group.items())
        }
    save_file(group, str(folder / "2_attn.safetensors"))
    counts = torch.arange(10_000, dtype=torch.int64).reshape(100, 100)
    if noise:
        counts[3, 4] += 1
    torch.save(counts, folder / "3_counts.pth")
    written["3_counts"] = counts
    return written


def stored_state(data: Path) -> dict[str, Any]:
    """Everything the data dir holds that must not depend on the number of workers."""
    services = open_services(Settings(data_dir=data, demo=False, workers=1))
    try:
        state: dict[str, Any] = {}
        with services.sessions() as db:
            state["tensors"] = sorted(
                (
                    t.name,
                    t.run_id,
                    t.digest,
                    t.numel,
                    t.min,
                    t.max,
                    t.mean,
                    t.std,
                    t.nan_count,
                    t.inf_count,
                    t.shape,
                    t.dtype,
                )
                for t in db.scalars(select(TensorRecord))
            )
            state["results"] = sorted(
                (r.cache_key, json.dumps(r.stats, sort_keys=True)) for r in db.scalars(select(ComparisonResultRecord))
            )
            slices = []
            for pair in db.scalars(select(PairRecord).order_by(PairRecord.position)):
                a, b, _ = views(services.store, db, pair)
                shape = a.shape
                if len(shape) == 2:
                    request = parse_slice_request(shape, ":,:", f"{shape[0] // 3},{shape[1] // 2}", "40,50")
                    heat = build_heatmap(a, b, (None, None))
                    slices.append((pair.name, read_slice(a, b, request), heat.cells.tolist()))
            state["slices"] = slices
        arrays = data / "arrays"
        state["chunks"] = {
            str(p.relative_to(arrays)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(arrays.rglob("*"))
            if p.is_file() and p.name not in ("zarr.json", MARKER)  # the marker: each data dir's own id
        }
        return state
    finally:
        services.close()


def test_results_are_the_same_for_any_number_of_workers(tmp_path: Path) -> None:
    reference = write_run(tmp_path / "ref", 0.0)
    write_run(tmp_path / "cand", 1e-3)
    outputs, states = [], []
    for workers in ("1", "3"):
        data = tmp_path / f"data-{workers}"
        done = main_cli(
            "--data-dir",
            str(data),
            "compare",
            str(tmp_path / "ref"),
            str(tmp_path / "cand"),
            "--name",
            "workers",
            "--json",
            env={"TENSOR_DEBUGGER_WORKERS": workers, "TENSOR_DEBUGGER_CHUNK_BYTES": SMALL_CHUNKS},
        )
        assert done.returncode == 1, done.stderr  # the planted differences fail
        outputs.append(json.loads(done.stdout))
        states.append(stored_state(data))
    one, three = outputs
    assert one == three
    assert one["first_divergence"]["name"] == "0_post_mlp"
    assert sorted(p["status"] for p in one["pairs"]).count("fail") >= 3
    assert states[0] == states[1]
    assert len(states[0]["chunks"]) > 500  # many chunks, so many blocks ran at once
    # the digest: BLAKE3 of the dtype and shape header, then the C-order bytes
    digests = {(name, run): digest for name, run, digest, *_ in states[0]["tensors"]}
    first_run = min(run for _, run in digests)
    for name, tensor in reference.items():
        dtype = parse_dtype(str(tensor.dtype).removeprefix("torch."))
        expected = blake3.blake3(
            digest_header(dtype, tuple(tensor.shape)) + np.ascontiguousarray(tensor.numpy()).tobytes()
        ).hexdigest()
        assert digests[(name, first_run)] == "blake3:" + expected
