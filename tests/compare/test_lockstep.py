"""Two runs ingested at once (`compare A B`) are compared from the blocks as they are read for storing
(compute/lockstep.py): the same results as comparing the stored copies, and no read of the stored chunks."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from tensor_debugger.compare.pipeline import compare_runs, ingest_run
from tensor_debugger.compare.planning.plan import plan_session
from tensor_debugger.compare.planning.requests import CompareRequest
from tensor_debugger.compare.reports.compare_report import CompareOutcome, ReadOnce
from tensor_debugger.compare.reports.pair_reports import session_pairs
from tensor_debugger.compare.reports.progress import pair_progress, session_progress
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.services import Services, open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store import catalog
from tensor_debugger.web.multipart import UploadBatch, UploadedFile
from tensor_debugger.web.uploads import RunOutcome, start_session, wait_for_runs

from tests.support.cli_main import main_cli

CHUNK_BYTES = 65536  # small chunks: many per pair block, straddling its edges, a short last one in each row
BIG = (2100, 2003)  # 4.2M values: two pair blocks (engine/streaming.REDUCED_BLOCK_BYTES), their edge inside a chunk


@pytest.fixture
def two_stores(tmp_path: Path) -> Iterator[tuple[Services, Services]]:
    """Two data dirs of the same settings, each with its SQLite database: a result cached in one is not in the other."""
    opened = [
        open_services(Settings(data_dir=tmp_path / name, demo=False, chunk_bytes=CHUNK_BYTES), {})
        for name in ("once", "stored")
    ]
    yield opened[0], opened[1]
    for services in opened:
        services.close()


def tensors(seed: int, candidate: bool) -> dict[str, dict[str, torch.Tensor]]:
    """Files of a run: file name -> its tensors (one-tensor .pth files hold "" as their only key)."""
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=generator)

    big = randn(*BIG)
    f64 = randn(1000, 333).double()
    bf16 = randn(300, 77).bfloat16()
    f16 = randn(513, 31).half()
    with_nan = randn(64, 1000)
    with_nan[3, 5] = float("nan")
    ints = torch.randint(-1000, 1000, (257, 9), generator=generator, dtype=torch.int32)
    longs = torch.randint(-(2**40), 2**40, (33,), generator=generator, dtype=torch.int64)
    bools = randn(45, 3) > 0
    bytes_ = torch.randint(0, 255, (100,), generator=generator, dtype=torch.uint8)
    shard0, shard1 = randn(128, 64), randn(128, 64)
    st_a, st_b = randn(17, 4099), randn(2, 3, 5).bfloat16()
    if candidate:  # some pairs within tolerance, some not
        big = big + 1e-7 * randn(*BIG)
        big[2099, 2000] += 0.25  # in the last chunk of the last pair block
        f64 = f64 + 1e-12
        bf16 = bf16 + 0.5
        f16 = f16.clone()
        f16[512, 30] = 7.0
        ints = ints + (torch.arange(ints.numel(), dtype=torch.int32).reshape(ints.shape) % 97 == 0)
        shard1 = shard1 + 1.0
        st_a = st_a * (1 + 1e-3)
    return {
        "00_big.pth": {"": big},
        "01_f64.pth": {"": f64},
        "02_bf16.pth": {"": bf16},
        "03_f16.pth": {"": f16},
        "04_nan.pth": {"": with_nan},
        "05_ints.pth": {"": ints},
        "06_longs.pth": {"": longs},
        "07_bools.pth": {"": bools},
        "08_bytes.pth": {"": bytes_},
        "09_scalar.pth": {"": torch.tensor(3.5)},
        "10_layer_rank0.pth": {"": shard0},
        "10_layer_rank1.pth": {"": shard1},
        "11_model.safetensors": {"attn.weight": st_a, "attn.bias": st_b},
    }


def write_run(folder: Path, files: dict[str, dict[str, torch.Tensor]]) -> Path:
    folder.mkdir(parents=True)
    for name, held in files.items():
        if name.endswith(".safetensors"):
            save_file(held, str(folder / name))
        else:
            torch.save(held[""], folder / name)
    return folder


def compare(services: Services, a: Path, b: Path) -> CompareOutcome:
    request = CompareRequest(a, b, str(a), str(b))
    return compare_runs(services.ingestor, services.context, services.compute, request, "http://here")


def stored_path(services: Services, a: Path, b: Path) -> list[tuple[Any, ...]]:
    """The pairs as comparing the stored copies gives them: each run ingested on its own, then compared."""
    for label, path in (("a", a), ("b", b)):
        outcome = ingest_run(services.ingestor, services.context, "stored", label, [InputFile(path, str(path))])
        assert outcome.payload.session is not None
        session_id = outcome.payload.session.id
    services.compute(session_id)
    with services.sessions() as db:
        report = session_pairs(db, session_id)
    return [(p.name, p.status, p.stats, p.where) for p in report.pairs]


def pairs_of(services: Services, outcome: CompareOutcome) -> list[tuple[Any, ...]]:
    assert outcome.payload.session is not None
    with services.sessions() as db:
        report = session_pairs(db, outcome.payload.session.id)
    return [(p.name, p.status, p.stats, p.where) for p in report.pairs]


def test_pairs_compared_as_they_are_read_equal_those_read_from_the_store(
    two_stores: tuple[Services, Services], tmp_path: Path
) -> None:
    once, stored = two_stores
    a = write_run(tmp_path / "ref", tensors(1, candidate=False))
    b = write_run(tmp_path / "cand", tensors(1, candidate=True))
    outcome = compare(once, a, b)
    assert outcome.exit_code == 1
    expected = stored_path(stored, a, b)
    got = pairs_of(once, outcome)
    assert [name for name, *_ in got] == [name for name, *_ in expected] and len(got) == 13
    for found, wanted in zip(got, expected, strict=True):
        assert found == wanted  # bit-identical statistics, and where the error is
    statuses = {name: status for name, status, *_ in got}
    assert statuses["00_big"] == statuses["02_bf16"] == statuses["03_f16"] == "fail"
    assert statuses["01_f64"] == "pass"
    # every float pair of one tensor a side was compared in memory (the NaN one too: only its block with the NaN is
    # read back); integers, bools, the 0-d tensor and the shards of a tensor split across ranks were read back
    assert outcome.read_once is not None
    assert outcome.read_once.in_memory == 7
    assert outcome.read_once.read_back == {
        "not read by the chunk loop (integers, bools, ULPs or shapes that differ)": 4,
        "a 0-d or empty tensor": 1,
        "a shard of a tensor split across ranks": 2,
    }


def test_a_comparison_of_two_freshly_ingested_runs_reads_none_of_its_chunks(
    two_stores: tuple[Services, Services], tmp_path: Path
) -> None:
    """Failing pairs included: where inside them the error is comes from the same blocks in memory."""
    once, stored = two_stores
    files = {name: held for name, held in tensors(2, candidate=False).items() if name[:2] in ("00", "01", "02", "11")}
    a = write_run(tmp_path / "ref", files)
    changed = {name: {k: v * (1 + 1e-9) for k, v in held.items()} for name, held in files.items()}
    changed["00_big.pth"][""][1500:1510, 7] += 1.0  # fails, in rows 1500-1509 and column 7
    changed["11_model.safetensors"]["attn.bias"] = changed["11_model.safetensors"]["attn.bias"] + 1
    b = write_run(tmp_path / "cand", changed)
    before = once.store.chunk_reads
    outcome = compare(once, a, b)
    assert once.store.chunk_reads == before  # counted by the store: the loop and the reader count every chunk read
    assert outcome.exit_code == 1, outcome
    assert outcome.read_once is not None and (outcome.read_once.in_memory, outcome.read_once.read_back) == (5, {})
    pairs = pairs_of(once, outcome)
    assert pairs == stored_path(stored, a, b)
    where = next(where for name, _, _, where in pairs if name == "00_big")
    assert where is not None and [(w.dim, w.ranges) for w in where] == [(0, [[1500, 1509]]), (1, [[7, 7]])]


def test_a_run_ahead_of_the_other_gives_its_pair_up_and_the_answer_is_the_same(
    two_stores: tuple[Services, Services], tmp_path: Path
) -> None:
    """The reference holds a big tensor the candidate lacks: while the reference reads it, the candidate reads the
    next one on its own. Neither ingest waits for the other for ever; the pair one run was far ahead on is read from
    the store, the pairs after are in step again."""
    once, stored = two_stores
    generator = torch.Generator().manual_seed(3)
    # a quarter of BIG a tensor (4 MiB): each of them still keeps the side ahead past its limit
    # (`lockstep_pairs.kept_limit`: two ingest blocks of CHUNK_BYTES chunks, 2 MiB) several times over, as BIG did, in
    # a quarter of the ingests
    shape = (BIG[0] // 4, BIG[1])
    values = [torch.randn(shape, generator=generator) for _ in range(4)]
    values[1] = torch.randn(4 * shape[0], shape[1], generator=generator)  # the reference reads it while ...
    values[2] = torch.randn(750, 2003, generator=generator)  # ... the candidate keeps more of this than it may
    for label, kept in (("ref", range(4)), ("cand", (0, 2, 3))):
        folder = tmp_path / label
        folder.mkdir()
        for n in kept:
            torch.save(values[n], folder / f"{n}_big.pth")
    outcome = compare(once, tmp_path / "ref", tmp_path / "cand")
    assert outcome.exit_code == 1, outcome  # a reference tensor without partner
    assert pairs_of(once, outcome) == stored_path(stored, tmp_path / "ref", tmp_path / "cand")
    assert outcome.read_once is not None
    # how many pairs were given up depends on the two ingests' speeds; the first is always in step
    read_back = outcome.read_once.read_back
    assert outcome.read_once.in_memory + sum(read_back.values()) == 3 and outcome.read_once.in_memory >= 1
    assert set(read_back) <= {"one run was far ahead of the other"}


def test_npy_files_and_fortran_order_are_compared_in_memory(
    two_stores: tuple[Services, Services], tmp_path: Path
) -> None:
    """.npy files (one in Fortran order, read through another reader) are compared from their blocks too."""
    once, stored = two_stores
    for label in ("ref", "cand"):
        folder = tmp_path / label
        folder.mkdir()
        values = np.arange(4096, dtype=np.float32).reshape(64, 64) * (1.5 if label == "cand" else 1.0)
        np.save(folder / "x.npy", values)
        np.save(folder / "y.npy", np.asfortranarray(np.linspace(0, 1, 30000).reshape(150, 200)))
    outcome = compare(once, tmp_path / "ref", tmp_path / "cand")
    assert outcome.exit_code == 1, outcome
    assert pairs_of(once, outcome) == stored_path(stored, tmp_path / "ref", tmp_path / "cand")
    assert outcome.read_once is not None and (outcome.read_once.in_memory, outcome.read_once.read_back) == (2, {})


def test_compare_verbose_says_how_the_pairs_were_read(tmp_path: Path, backend_env: dict[str, str]) -> None:
    files = {name: held for name, held in tensors(4, candidate=False).items() if name[:2] in ("01", "05")}
    a = write_run(tmp_path / "ref", files)
    b = write_run(tmp_path / "cand", files)
    done = main_cli("--data-dir", str(tmp_path / "data"), "compare", str(a), str(b), "--verbose", env=backend_env)
    assert done.returncode == 0, done.stderr
    assert (
        "read once: 1 pairs compared from the bytes as they were ingested, 1 read back from the store "
        "(1 not read by the chunk loop (integers, bools, ULPs or shapes that differ))"
    ) in done.stderr
    quiet = main_cli("--data-dir", str(tmp_path / "data2"), "compare", str(a), str(b), env=backend_env)
    assert quiet.returncode == 0 and "read once" not in quiet.stderr


def upload_both(
    services: Services, a: Path, b: Path, fields: tuple[str, str] = ("ref", "cand"), reference_last: bool = False
) -> tuple[int, list[RunOutcome]]:
    """What the API does with an upload of a reference (field `fields[0]`) and a candidate (`fields[1]`) that makes
    a session (`reference_last`: its field comes second): their ingests queued in the server's child processes, the
    request waiting for them; then the pairs the early comparisons left are computed (a server's worker would)."""
    folder = a.parent / "upload"
    folder.mkdir()
    batch = UploadBatch(folder)
    order = ((a, fields[0]), (b, fields[1]))
    for run, field in order[::-1] if reference_last else order:
        for path in sorted(run.iterdir()):
            copy = folder / field / path.name
            copy.parent.mkdir(exist_ok=True)
            shutil.copyfile(path, copy)
            batch.files.append(UploadedFile(field, path.name, copy))
    session_id, started = start_session(services, "upload", "", batch, keep_failure=False)
    outcomes = wait_for_runs(started)
    services.compute(session_id)
    return session_id, outcomes


def test_an_upload_of_both_runs_is_compared_as_it_is_read_with_the_stored_paths_results(
    two_stores: tuple[Services, Services], tmp_path: Path
) -> None:
    """The API's upload of a reference and a candidate: both ingest at once in one child process, which compares
    their pairs from the blocks as they are read and sends the statistics to the server's early comparisons. The
    same results as the stored path, every dtype family and the shards of a tensor split across ranks included; the
    server reads none of the chunks of the pairs compared in memory, and the session's progress says how many."""
    once, stored = two_stores
    a = write_run(tmp_path / "ref", tensors(5, candidate=False))
    b = write_run(tmp_path / "cand", tensors(5, candidate=True))
    before = once.store.chunk_reads
    session_id, outcomes = upload_both(once, a, b)
    assert [o.status for o in outcomes] == ["ready", "ready"], outcomes
    with once.sessions() as db:
        got = [(p.name, p.status, p.stats, p.where) for p in session_pairs(db, session_id).pairs]
    expected = stored_path(stored, a, b)
    assert [name for name, *_ in got] == [name for name, *_ in expected] and len(got) == 13
    for found, wanted in zip(got, expected, strict=True):
        assert found == wanted  # bit-identical statistics, and where the error is
    figures = once.early.figures(session_id)
    assert figures is not None and figures.read_once is not None
    assert figures.read_once.in_memory == 7
    assert figures.read_once.read_back == {
        "not read by the chunk loop (integers, bools, ULPs or shapes that differ)": 4,
        "a 0-d or empty tensor": 1,
        "a shard of a tensor split across ranks": 2,
    }
    live = once.ingests.snapshot()
    with once.sessions() as db:
        session = catalog.get_session(db, session_id)
        progress = session_progress(session, live, pair_progress(db, session_id), figures)
    assert progress.early.read_once == ReadOnce(7, figures.read_once.read_back)
    # the server read back the chunks of the pairs read back, and of the NaN's block: as many as the CLI's
    # `compare A B`, which compares the same pairs in memory in its own process, and no more
    reads = once.store.chunk_reads - before
    cli = open_services(Settings(data_dir=tmp_path / "cli", demo=False, chunk_bytes=CHUNK_BYTES), {})
    try:
        outcome = compare(cli, a, b)
        assert outcome.read_once is not None and outcome.read_once.in_memory == 7
        assert reads == cli.store.chunk_reads, (reads, cli.store.chunk_reads)
    finally:
        cli.close()


@pytest.mark.parametrize("reference_last", [False, True], ids=["in order", "reference field last"])
def test_an_upload_of_two_freshly_ingested_runs_reads_none_of_its_chunks(
    two_stores: tuple[Services, Services], tmp_path: Path, reference_last: bool
) -> None:
    """The reference is the first field, or the one named "reference" wherever it comes."""
    once, stored = two_stores
    files = {name: held for name, held in tensors(6, candidate=False).items() if name[:2] in ("00", "01", "02", "11")}
    a = write_run(tmp_path / "ref", files)
    changed = {name: {k: v * (1 + 1e-9) for k, v in held.items()} for name, held in files.items()}
    changed["00_big.pth"][""][1500:1510, 7] += 1.0
    b = write_run(tmp_path / "cand", changed)
    before = once.store.chunk_reads
    fields = ("reference", "candidate") if reference_last else ("ref", "cand")
    session_id, _ = upload_both(once, a, b, fields, reference_last)
    assert once.store.chunk_reads == before
    figures = once.early.figures(session_id)
    assert figures is not None and figures.read_once is not None
    assert (figures.read_once.in_memory, figures.read_once.read_back) == (5, {})
    with once.sessions() as db:
        got = [(p.name, p.status, p.stats, p.where) for p in session_pairs(db, session_id).pairs]
    assert got == stored_path(stored, a, b)
    assert {name: status for name, status, *_ in got}["00_big"] == "fail"


def stored_session(services: Services, runs: list[tuple[str, Path, str | None]]) -> list[tuple[Any, ...]]:
    """The pairs as comparing the stored copies gives them: each run ingested in turn (`role` "noise": a rerun of
    the reference), nothing compared while they ingest, then the session planned and computed."""
    for label, path, role in runs:
        pending = services.ingestor.begin("stored", label, [str(path)], by_label=False, role=role)
        services.ingestor.complete(pending, [InputFile(path, str(path))])
    plan_session(services.context, pending.session_id)
    services.compute(pending.session_id)
    with services.sessions() as db:
        report = session_pairs(db, pending.session_id)
    return [(p.name, p.status, p.stats, p.where, p.rule, p.noise_max_abs_diff) for p in report.pairs]


def test_compare_of_three_runs_and_a_rerun_reads_every_pair_once(
    two_stores: tuple[Services, Services], tmp_path: Path
) -> None:
    """`compare A B C --noise R`: the reference's blocks go to the pairs of each other run (the rerun's too), each
    read in lockstep with it; the same verdicts, statistics, noise floors and where as the stored path."""
    once, stored = two_stores
    kept = ("00", "01", "02", "03", "04", "05", "11")

    def run(label: str, candidate: bool, change: float) -> Path:
        files = {name: held for name, held in tensors(7, candidate).items() if name[:2] in kept}
        changed = {
            name: {k: v * (1 + change) if v.is_floating_point() else v for k, v in held.items()}
            for name, held in files.items()
        }
        return write_run(tmp_path / label, changed)

    a, rerun, b, c = run("ref", False, 0.0), run("rerun", False, 5e-3), run("cand", True, 0.0), run("c2", False, 0.01)
    request = CompareRequest(a, b, str(a), str(b), more=(c,), more_shown=(str(c),), noise=rerun, noise_shown=str(rerun))
    before = once.store.chunk_reads
    outcome = compare_runs(once.ingestor, once.context, once.compute, request, "http://here")
    once_reads = once.store.chunk_reads - before
    assert outcome.exit_code == 1, outcome
    assert outcome.payload.session is not None
    with once.sessions() as db:
        report = session_pairs(db, outcome.payload.session.id)
    got = [(p.name, p.status, p.stats, p.where, p.rule, p.noise_max_abs_diff) for p in report.pairs]
    before = stored.store.chunk_reads
    expected = stored_session(stored, [("ref", a, None), ("rerun", rerun, "noise"), ("cand", b, None), ("c2", c, None)])
    stored_reads = stored.store.chunk_reads - before
    assert len(got) == 2 * 8 and got == expected
    assert {p.rule for p in report.pairs} == {"tolerance", "noise"}
    # of each of the three runs against the reference, its 7 float pairs in memory, its integers read back
    assert outcome.read_once is not None
    assert (outcome.read_once.in_memory, outcome.read_once.read_back) == (
        21,
        {"not read by the chunk loop (integers, bools, ULPs or shapes that differ)": 3},
    )
    assert once_reads * 10 < stored_reads, (once_reads, stored_reads)  # the NaN's blocks and the integers only


def test_a_run_far_ahead_keeps_two_blocks_copies_none(two_stores: tuple[Services, Services], tmp_path: Path) -> None:
    """The candidate's ingest starts only once the reference has stopped reading (or has read every file): the
    reference, ahead, keeps at most two ingest blocks over all its pairs (not each pair's blocks: before, it kept
    every tensor the candidate had not read yet), waits for the candidate to catch up instead of copying the blocks
    it lent, and every pair is still compared in memory, with the stored path's results. Counted by the comparison
    (`ReadOnce.most_kept`, `copied`), not timed."""
    once, stored = two_stores
    generator = torch.Generator().manual_seed(5)
    count, rows = 12, 256  # one 1 MiB ingest block a tensor: 16 chunks of CHUNK_BYTES (256 x 1024 float32)
    block = 16 * CHUNK_BYTES
    for label in ("ref", "cand"):
        (tmp_path / label).mkdir()
    for n in range(count):
        values = torch.randn(rows, 1024, generator=generator)
        torch.save(values, tmp_path / "ref" / f"{n:02}.pth")
        torch.save(values + (1e-3 if n % 3 == 0 else 0.0), tmp_path / "cand" / f"{n:02}.pth")
    opened: list[float] = []  # when the reference opened each file
    lock = threading.Condition()

    def reading(run_id: int, label: str) -> None:
        if "ref" in Path(label).parts:
            with lock:
                opened.append(time.monotonic())
                lock.notify_all()
            return
        with lock:  # the candidate: wait until the reference has read every file or stopped for a second
            lock.wait_for(lambda: len(opened) == count or (opened and time.monotonic() - opened[-1] > 1.0), 120)

    def quiet() -> None:  # wakes the candidate's wait while the reference stands still
        while not done.is_set():
            with lock:
                lock.notify_all()
            time.sleep(0.1)

    done = threading.Event()
    ticker = threading.Thread(target=quiet)
    ticker.start()
    once.ingestor.reading = reading
    try:
        outcome = compare(once, tmp_path / "ref", tmp_path / "cand")
    finally:
        done.set()
        ticker.join()
    assert outcome.exit_code == 1, outcome
    assert len(opened) == count
    assert pairs_of(once, outcome) == stored_path(stored, tmp_path / "ref", tmp_path / "cand")
    assert outcome.read_once is not None and (outcome.read_once.in_memory, outcome.read_once.read_back) == (count, {})
    assert block <= outcome.read_once.most_kept <= 2 * block
    assert outcome.read_once.copied == 0
