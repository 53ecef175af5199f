"""`capture`: a live model's module inputs and outputs straight into a run, locally or through the server."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load_file
from sqlalchemy import select
from tensor_debugger import capture
from tensor_debugger.compare.pair_reports import session_pairs
from tensor_debugger.compare.plan import Comparisons
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.live.recorder import safetensors_codes, write_safetensors
from tensor_debugger.services import Services, open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store.models import PairRecord, RunRecord, TensorRecord, UnmatchedRecord
from torch import nn

from tests.conftest import LiveServer
from tests.dumps import random_bits
from tests.traces import MODEL_CLASS, input_ids, tiny_llama, write_trace


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
        return list(db.scalars(select(TensorRecord).where(TensorRecord.run_id == run_id)
                               .order_by(TensorRecord.position)))


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
            "Net.block#2", "outputs_0")
        assert by_name["Net_outputs"].dtype == "bfloat16"
        view = services.store.open(by_name["Net_outputs"].store_key, by_name["Net_outputs"].digest)
        stored = torch.from_numpy(view[...].copy()).view(torch.bfloat16)
        assert torch.equal(stored, expected)  # bit for bit
        with services.sessions() as db:
            tree = db.get_one(RunRecord, result.run_id).module_tree
        assert tree is not None and tree["roots"][0]["path"] == "Net"
        assert [c["path"] for c in tree["roots"][0]["children"]] == ["Net.block", "Net.block#2", "Net.head"]
    finally:
        services.close()


EXPECTED_NAMES = [
    "Net_inputs_args_0",
    "Net.block_inputs_args_0", "Net.block.proj_inputs_args_0", "Net.block.proj_outputs",
    "Net.block_outputs_0", "Net.block_outputs_1_sum",
    "Net.block#2_inputs_args_0", "Net.block.proj#2_inputs_args_0", "Net.block.proj#2_outputs",
    "Net.block#2_outputs_0", "Net.block#2_outputs_1_sum",
    "Net.head_inputs_args_0", "Net.head_outputs",
    "Net_outputs",
]


def test_capture_matches_a_debugger_trace_bit_for_bit(settings: Settings, tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "trace")
    model = tiny_llama()
    with torch.no_grad(), capture(model, session="both", run="captured", data_dir=settings.data_dir) as result:
        model(input_ids())
    services = open_services(settings)
    try:
        services.ingestor.ingest("both", "trace", [InputFile(trace, "trace")])
        assert result.session_id is not None
        services.plan(result.session_id)
        services.comparisons.compute_pending(result.session_id)
        with services.sessions() as db:
            pairs = db.scalars(select(PairRecord).where(PairRecord.session_id == result.session_id)).all()
            assert len(pairs) == len(list(trace.glob("*.safetensors")))  # every tensor of the trace is paired
            for pair in pairs:
                a, b = Comparisons.tensors_of(db, pair)
                assert [t.digest for t in a] == [t.digest for t in b], pair.name  # identical bytes
                assert pair.status == "pass"
            # what the capture has beyond the trace: outputs of modules with children, which the debugger drops
            extra = list(db.scalars(select(UnmatchedRecord.name)
                                    .where(UnmatchedRecord.session_id == result.session_id)))
            assert extra and all(n.endswith(("_outputs", "_outputs_0", "_outputs_1", "_outputs_last_hidden_state"))
                       for n in extra)
            report = session_pairs(db, result.session_id, modules=True)
        assert report["first_divergence"] is None and report["modules"]["culprit"] is None
    finally:
        services.close()


def test_capture_with_a_pattern_and_through_the_server(live_server: LiveServer) -> None:
    reference, candidate = tiny_llama(), tiny_llama(perturb="model.layers.1.mlp.down_proj.weight")
    for model, run in ((reference, "reference"), (candidate, "candidate")):
        with torch.no_grad(), capture(model, session="over http", run=run, server=live_server.url,
                                      modules="model.layers.*") as result:
            model(input_ids())
    assert result.session_id is not None
    with httpx.Client(base_url=live_server.url, timeout=30) as client:
        deadline = time.monotonic() + 120
        while (report := client.get(f"/api/sessions/{result.session_id}/pairs").json())["progress"]["pending"] or \
                not report["pairs"]:
            assert time.monotonic() < deadline, "pairs still pending"
            time.sleep(0.3)
        names = {p["name"] for p in report["pairs"]}
        assert f"{MODEL_CLASS}_inputs_args_0" in names  # the model itself is always recorded
        assert not any(".embed_tokens" in n or ".lm_head" in n for n in names)  # not matching the pattern
        assert report["modules"]["culprit"]["module_path"] == f"{MODEL_CLASS}.model.layers.1.mlp.down_proj"
        session = client.get(f"/api/sessions/{result.session_id}").json()
        assert [r["label"] for r in session["runs"]] == ["reference", "candidate"]


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
