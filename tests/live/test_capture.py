"""`capture`: a live model's module inputs and outputs straight into a run, locally or through the server."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from sqlalchemy import select
from tensor_debugger import capture
from tensor_debugger.compare.planning import sides
from tensor_debugger.compare.reports.pair_reports import session_pairs
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.ingest.writer import WritePools
from tensor_debugger.live.safetensors_files import safetensors_codes, write_safetensors
from tensor_debugger.live.writer import CaptureError, CaptureWriter, HostBufferPool, Job, Sink
from tensor_debugger.services import Services, open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store.models import PairRecord, RunRecord, TensorRecord, UnmatchedRecord
from torch import nn

from tests.support import loopback_http
from tests.support.dumps import random_bits
from tests.support.polling import wait_until
from tests.support.servers import READ_TOKEN, WRITE_TOKEN, LiveServer, bearer
from tests.support.traces import MODEL_CLASS, PERTURBED, WrittenTraces, input_ids, tiny_llama


class Pair(nn.Module):
    """Returns a tuple, a dict and a non-tensor; called twice by its parent."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> tuple[torch.Tensor, dict[str, object]]:
        y = self.proj(x) * scale
        return y, {"sum": y.sum(dim=-1), "note": "not a tensor", "mask": None}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = Pair()
        self.head = nn.Linear(4, 2).to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first, _ = self.block(x)
        second, extra = self.block(first, scale=0.5)
        out: torch.Tensor = self.head((second + extra["sum"][..., None]).to(torch.bfloat16))
        return out


def tensors_of(services: Services, run_id: int) -> list[TensorRecord]:
    with services.sessions() as db:
        return list(
            db.scalars(select(TensorRecord).where(TensorRecord.run_id == run_id).order_by(TensorRecord.position))
        )


def test_capture_keeps_every_call_tuples_dicts_and_skips_non_tensors(settings: Settings) -> None:
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(3, 4)
    with torch.no_grad(), capture(net, session="net", run="ref", data_dir=settings.data_dir) as result:
        expected = net(x)
    assert result.tensors == len(EXPECTED_NAMES) and result.session_id is not None and result.run_id is not None
    services = open_services(settings)
    try:
        rows = tensors_of(services, result.run_id)
        assert [t.name for t in rows] == EXPECTED_NAMES  # call order: inputs, children, outputs
        by_name = {t.name: t for t in rows}
        assert "Net.block#2_inputs_kwargs_scale" not in by_name  # a float kwarg is no tensor
        assert (by_name["Net.block#2_outputs_0"].module_path, by_name["Net.block#2_outputs_0"].place) == (
            "Net.block#2",
            "outputs_0",
        )
        assert by_name["Net_outputs"].dtype == "bfloat16"
        view = services.store.open(by_name["Net_outputs"].store_key, by_name["Net_outputs"].digest)
        stored = torch.from_numpy(np.array(view[...])).view(torch.bfloat16)
        assert torch.equal(stored, expected)  # bit for bit
        with services.sessions() as db:
            tree = db.get_one(RunRecord, result.run_id).module_tree
        assert tree is not None and tree["roots"][0]["path"] == "Net"
        assert [c["path"] for c in tree["roots"][0]["children"]] == ["Net.block", "Net.block#2", "Net.head"]
    finally:
        services.close()


EXPECTED_NAMES = [
    "Net_inputs_args_0",
    "Net.block_inputs_args_0",
    "Net.block.proj_inputs_args_0",
    "Net.block.proj_outputs",
    "Net.block_outputs_0",
    "Net.block_outputs_1_sum",
    "Net.block#2_inputs_args_0",
    "Net.block.proj#2_inputs_args_0",
    "Net.block.proj#2_outputs",
    "Net.block#2_outputs_0",
    "Net.block#2_outputs_1_sum",
    "Net.head_inputs_args_0",
    "Net.head_outputs",
    "Net_outputs",
]


def test_capture_matches_a_debugger_trace_bit_for_bit(settings: Settings, hf_traces: WrittenTraces) -> None:
    trace = hf_traces["eager"]
    model = tiny_llama()
    with torch.no_grad(), capture(model, session="both", run="captured", data_dir=settings.data_dir) as result:
        model(input_ids())
    services = open_services(settings)
    try:
        services.ingestor.ingest("both", "trace", [InputFile(trace, "trace")])
        assert result.session_id is not None
        services.plan(result.session_id)
        services.compute(result.session_id)
        with services.sessions() as db:
            pairs = db.scalars(select(PairRecord).where(PairRecord.session_id == result.session_id)).all()
            assert len(pairs) == len(list(trace.glob("*.safetensors")))  # every tensor of the trace is paired
            for pair in pairs:
                a, b = sides.tensors_of(db, pair)
                assert [t.digest for t in a] == [t.digest for t in b], pair.name  # identical bytes
                assert pair.status == "pass"
            # what the capture has beyond the trace: outputs of modules with children, which the debugger drops
            extra = list(
                db.scalars(select(UnmatchedRecord.name).where(UnmatchedRecord.session_id == result.session_id))
            )
            assert extra and all(
                n.endswith(("_outputs", "_outputs_0", "_outputs_1", "_outputs_last_hidden_state")) for n in extra
            )
            report = session_pairs(db, result.session_id, modules=True)
        assert report.first_divergence is None and report.modules is not None and report.modules.culprit is None
    finally:
        services.close()


def test_capture_with_a_pattern_and_through_the_server(shared_server: LiveServer) -> None:
    reference, candidate = tiny_llama(), tiny_llama(perturb=PERTURBED)
    for model, run in ((reference, "reference"), (candidate, "candidate")):
        with (
            torch.no_grad(),
            capture(model, session="over http", run=run, server=shared_server.url, modules="model.layers.*") as result,
        ):
            model(input_ids())
    assert result.session_id is not None
    with httpx.Client(base_url=shared_server.url, timeout=30) as client:
        report = wait_until(
            lambda: client.get(f"/api/sessions/{result.session_id}/pairs").json(),
            until=lambda r: r["pairs"] and not r["progress"]["pending"],
            what="the captured session's pairs to be computed",
            timeout=120,
            interval=0.03,
        )
        names = {p["name"] for p in report["pairs"]}
        assert f"{MODEL_CLASS}_inputs_args_0" in names  # the model itself is always recorded
        assert not any(".embed_tokens" in n or ".lm_head" in n for n in names)  # not matching the pattern
        assert report["modules"]["culprit"]["module_path"] == f"{MODEL_CLASS}.model.layers.1.mlp.down_proj"
        session = client.get(f"/api/sessions/{result.session_id}").json()
        assert [r["label"] for r in session["runs"]] == ["reference", "candidate"]


def test_capture_sends_the_servers_token(token_server: LiveServer) -> None:
    net = Net()
    for token, status in ((None, "401"), (READ_TOKEN, "403")):
        with (
            pytest.raises(RuntimeError, match=status),
            torch.no_grad(),
            capture(net, session="captured with a token", run="r", server=token_server.url, token=token),
        ):
            net(torch.randn(2, 4))
    with (
        torch.no_grad(),
        capture(net, session="captured with a token", run="r", server=token_server.url, token=WRITE_TOKEN) as result,
    ):
        net(torch.randn(2, 4))
    session = loopback_http.get(
        f"{token_server.url}/api/sessions/{result.session_id}", headers=bearer(READ_TOKEN)
    ).json()
    assert session["name"] == "captured with a token" and [r["id"] for r in session["runs"]] == [result.run_id]


def test_nothing_is_kept_when_the_block_raises(settings: Settings) -> None:
    net = Net()
    with pytest.raises(ValueError, match="boom"), capture(net, session="never", run="r", data_dir=settings.data_dir):
        net(torch.randn(2, 4))
        raise ValueError("boom")
    services = open_services(settings)
    try:
        with services.sessions() as db:
            assert db.scalars(select(RunRecord)).all() == []
    finally:
        services.close()


@pytest.mark.parametrize("dtype", sorted(safetensors_codes(), key=str))
def test_a_captured_tensor_is_written_chunk_by_chunk_bit_for_bit(tmp_path: Path, dtype: torch.dtype) -> None:
    """Every dtype ingest reads from safetensors, copied to the host 8 bytes at a time (many chunks, a short one
    last), reads back bit for bit with the safetensors library."""
    tensor = random_bits((37, 3), dtype, seed=9)
    path = tmp_path / "x.safetensors"
    write_safetensors(path, tensor, chunk_bytes=8)
    back = load_file(str(path))["data"]
    assert back.dtype == dtype and back.shape == tensor.shape
    if dtype == torch.bool:
        assert torch.equal(back, tensor)
    else:
        assert torch.equal(back.reshape(-1).view(torch.uint8), tensor.reshape(-1).view(torch.uint8))


# --- the writer behind the hooks ----------------------------------------------------------------------------------


def test_the_buffer_pool_lends_no_more_than_its_budget_and_makes_takers_wait() -> None:
    made: list[int] = []

    def allocate(nbytes: int, pinned: bool) -> torch.Tensor:
        assert not pinned
        made.append(nbytes)
        return torch.empty(nbytes, dtype=torch.uint8)

    pool = HostBufferPool(100, allocate)
    first = pool.take(60)
    got: list[torch.Tensor] = []
    taker = threading.Thread(target=lambda: got.append(pool.take(60)))
    taker.start()
    # blocked: 60 + 60 would pass the budget
    wait_until(lambda: pool.waits == 1, what="the second taker to wait", timeout=30, interval=0.005)
    assert not got and pool.lent == 60
    pool.give(first)
    taker.join()
    assert got[0].data_ptr() == first.data_ptr() and made == [60]  # the buffer given back is lent again
    second = pool.take(30)  # fits beside the 60 lent: a new buffer
    assert made == [60, 30] and pool.lent == 90 and pool.peak_lent == 90
    pool.give(got[0])
    pool.give(second)
    # 80 bytes: neither kept buffer is large enough; they are let go until a new one fits the budget
    big = pool.take(80)
    assert made == [60, 30, 80] and pool.held <= 100
    pool.give(big)
    # larger than the whole budget: lent alone, once nothing else is out
    huge = pool.take(250)
    assert huge.numel() == 250 and pool.held == 250
    pool.give(huge)
    assert pool.take(10).numel() >= 10 and pool.held <= 250
    assert pool.peak_lent == 250


class Recording(Sink):
    """Keeps a copy of every tensor written, and may be held up or fail."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.written: dict[int, tuple[str, torch.Tensor]] = {}
        self.gate = threading.Event()
        self.gate.set()
        self.fail_on = fail_on
        self.lock = threading.Lock()

    def write(self, job: Job, pools: WritePools) -> None:
        self.gate.wait()
        if job.name == self.fail_on:
            raise OSError("no space left on device")
        with self.lock:
            self.written[job.index] = (job.name, job.host.clone())


def test_the_writer_holds_hooks_back_when_its_budget_is_spent_and_writes_values_as_submitted() -> None:
    sink = Recording()
    sink.gate.clear()  # workers hold on to what they take until the gate opens
    writer = CaptureWriter(sink, host_memory=3 * 64 * 4, workers=2)
    tensors = [torch.full((64,), float(i)) for i in range(8)]  # 256 bytes each

    def submit_all() -> None:
        for i, t in enumerate(tensors):
            writer.submit(i, f"t{i}", t)

    submitter = threading.Thread(target=submit_all)
    submitter.start()
    wait_until(
        lambda: writer.pool.waits >= 1, what="a hook to wait for a buffer", timeout=30, interval=0.005
    )  # the fourth tensor waits for a buffer to come back
    assert writer.pool.lent == 3 * 256
    tensors[0].add_(100)  # changed in place after its hook: what is written is the value when it was submitted
    sink.gate.set()
    submitter.join()
    writer.close()
    assert writer.pool.peak_lent <= 3 * 256 and writer.copier is None  # a CPU-only capture never touches CUDA
    assert sorted(sink.written) == list(range(8))
    for i, (name, value) in sink.written.items():
        assert name == f"t{i}" and torch.equal(value, torch.full((64,), float(i)))


def test_a_failed_write_is_raised_from_the_next_hook_or_the_end() -> None:
    sink = Recording(fail_on="t1")
    writer = CaptureWriter(sink, host_memory=1 << 20, workers=1)
    writer.submit(0, "t0", torch.ones(4))
    writer.submit(1, "t1", torch.ones(4))
    wait_until(lambda: writer._error is not None, what="the write to fail", timeout=30, interval=0.005)
    with pytest.raises(CaptureError, match="no space left"):
        writer.submit(2, "t2", torch.ones(4))
    with pytest.raises(CaptureError, match="no space left"):
        writer.close()
    assert writer.pool.lent == 0


class AllDtypes(nn.Module):
    """Returns a tensor of every dtype capture writes, a strided view, a scalar and an empty tensor, then changes
    one of them in place."""

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        out = {str(d).removeprefix("torch."): random_bits((37, 3), d, seed=9) for d in safetensors_codes()}
        out["strided"] = random_bits((6, 5), torch.bfloat16, seed=3).t()
        out["scalar"] = x.sum()
        out["empty"] = torch.empty(0, 4, dtype=torch.float16)
        return out


class Mutates(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = AllDtypes()

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = self.inner(x)
        out["float32"].add_(1)  # after the inner module's hook fired: the capture keeps the value before
        return out


@pytest.mark.parametrize("host_memory", [1 << 30, 64])
def test_captured_arrays_are_the_bytes_ingest_stores_for_every_dtype(
    settings: Settings, tmp_path: Path, host_memory: int
) -> None:
    """What the hooks write straight into the store, with a budget that fits everything or one small tensor at a
    time, has the digest and stored bytes that ingesting the same tensors as safetensors files gives."""
    model = Mutates()
    x = torch.randn(5)
    with (
        torch.no_grad(),
        capture(model, session="dtypes", run="captured", data_dir=settings.data_dir, host_memory=host_memory) as result,
    ):
        model(x)
    files = tmp_path / "files"
    files.mkdir()
    for name, tensor in AllDtypes()(x).items():
        write_safetensors(files / f"Mutates.inner_outputs_{name}.safetensors", tensor)
    services = open_services(settings)
    try:
        ingested = services.ingestor.ingest("dtypes", "files", [InputFile(files, "files")])
        assert result.run_id is not None
        captured = {t.name: t for t in tensors_of(services, result.run_id)}
        expected = tensors_of(services, ingested.run_id)
        assert len(expected) == len(safetensors_codes()) + 3
        for want in expected:
            got = captured[want.name.removesuffix(".data")]  # a loose file's key is part of its tensor's name
            assert (got.digest, got.shape, got.dtype, got.nbytes) == (
                want.digest,
                want.shape,
                want.dtype,
                want.nbytes,
            ), want.name
            assert (got.min, got.max, got.nan_count) == (want.min, want.max, want.nan_count), want.name
            a = np.asarray(services.store.open(got.store_key, got.digest)[...])
            b = np.asarray(services.store.open(want.store_key, want.digest)[...])
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), want.name
        assert captured["Mutates_outputs_float32"].digest != captured["Mutates.inner_outputs_float32"].digest
    finally:
        services.close()


def test_a_failed_write_keeps_nothing(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    from tensor_debugger.live import writer as capture_writer

    def broken(*args: object, **kwargs: object) -> None:
        raise OSError("no space left on device")

    monkeypatch.setattr(capture_writer, "write_leaf", broken)
    net = Net()
    with (
        pytest.raises(CaptureError, match="no space left"),
        capture(net, session="full", run="r", data_dir=settings.data_dir),
    ):
        net(torch.randn(2, 4))
    services = open_services(settings)
    try:
        with services.sessions() as db:
            assert db.scalars(select(RunRecord)).all() == []
        assert not list((settings.data_dir).rglob("runs/*/*"))
    finally:
        services.close()
