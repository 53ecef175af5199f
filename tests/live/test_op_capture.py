"""`capture(level="op")`: every torch function a forward calls, in order, named and traced to its source line; the
first diverging op of a port with a planted bug, with its line in both implementations."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812 (the name models use)
from litestar.testing import TestClient
from tensor_debugger import capture
from tensor_debugger.cli.compare_output import print_table
from tensor_debugger.compare.planning.sides import tensors_of
from tensor_debugger.compare.reports.compare_report import to_json
from tensor_debugger.compare.reports.contract import compare_report
from tensor_debugger.compare.reports.module_reports import ModuleNodeReport
from tensor_debugger.compare.reports.op_lists import op_lists
from tensor_debugger.services import open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store.models import PairRecord
from tensor_debugger.web.app import create_app
from torch import nn

from tests.support.op_models import DIM, Attention, Drift, Net, line_of, models
from tests.support.op_models import HERE as MODELS_FILE
from tests.support.polling import wait_until
from tests.support.servers import LiveServer
from tests.support.sessions import compared_with_unmatched as compared
from tests.support.sessions import rows_of
from tests.support.source_lines import marked_line
from tests.support.traces import MODEL_CLASS, input_ids, tiny_llama

HERE = Path(__file__)
line_here = partial(marked_line, HERE)  # `path:line` of this file's line ending with the comment `marker`


def walk(node: ModuleNodeReport) -> Iterator[ModuleNodeReport]:
    yield node
    for child in node.children:
        yield from walk(child)


def test_ops_are_recorded_in_order_named_by_module_op_and_call_with_their_source_line(settings: Settings) -> None:
    reference, _ = models()
    x = torch.randn(2, 5, DIM, generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), capture(reference, "ops", "reference", data_dir=settings.data_dir, level="op") as result:
        expected = reference(x)
    assert result.run_id is not None
    rows = rows_of(settings, result.run_id)
    layer = [r for r in rows if r.module_path and r.module_path.startswith("Net.layers.1.self_attn")]
    assert [r.name for r in layer] == [
        "Net.layers.1.self_attn_inputs_args_0",
        "Net.layers.1.self_attn.q_proj_inputs_args_0",
        "Net.layers.1.self_attn.q_proj/linear#1_outputs",  # F.linear, inside the q_proj module
        "Net.layers.1.self_attn.q_proj_outputs",
        "Net.layers.1.self_attn.k_proj_inputs_args_0",
        "Net.layers.1.self_attn.k_proj/linear#1_outputs",
        "Net.layers.1.self_attn.k_proj_outputs",
        "Net.layers.1.self_attn.v_proj_inputs_args_0",
        "Net.layers.1.self_attn.v_proj/linear#1_outputs",
        "Net.layers.1.self_attn.v_proj_outputs",
        "Net.layers.1.self_attn/transpose#1_outputs",
        "Net.layers.1.self_attn/matmul#1_outputs",
        "Net.layers.1.self_attn/mul#1_outputs",  # `* self.scaling`
        "Net.layers.1.self_attn/softmax#1_outputs",
        "Net.layers.1.self_attn/matmul#2_outputs",  # `weights @ v`: the second matmul of this call
        "Net.layers.1.self_attn.o_proj_inputs_args_0",
        "Net.layers.1.self_attn.o_proj/linear#1_outputs",
        "Net.layers.1.self_attn.o_proj_outputs",
        "Net.layers.1.self_attn_outputs",
    ]
    by_name = {r.name: r for r in rows}
    softmax = by_name["Net.layers.1.self_attn/softmax#1_outputs"]
    assert (softmax.module_path, softmax.place, softmax.layer) == ("Net.layers.1.self_attn/softmax#1", "outputs", 1)
    assert softmax.source == line_of("reference softmax")
    assert by_name["Net.layers.1.self_attn/mul#1_outputs"].source == line_of("reference scores")
    # an op inside an nn.Linear is traced to the line that called the module, outside torch
    assert by_name["Net.layers.1.self_attn.o_proj/linear#1_outputs"].source is not None
    assert by_name["Net.layers.1.self_attn.o_proj/linear#1_outputs"].source.startswith(f"{MODELS_FILE}:")
    # the block's own arithmetic and the model's: `x + ...` twice in each block, tanh at the root
    assert by_name["Net.layers.2/add#2_outputs"].position < by_name["Net.layers.2_outputs"].position
    assert [r.name for r in rows][-2:] == ["Net/tanh#1_outputs", "Net_outputs"]
    assert [r.position for r in rows] == list(range(len(rows)))
    modules = [r for r in rows if "/" not in (r.module_path or "")]
    assert all(r.source is None for r in modules if (r.place or "").startswith("outputs"))  # outputs have none
    # a module's inputs: the line that called the module (layer 1's: `x = layer(x)` in Net.forward)
    assert all(r.source for r in modules if (r.place or "").startswith("inputs"))
    called = next(r.source for r in modules if r.name == "Net.layers.1_inputs_args_0")
    assert called == line_of("net calls a layer"), called
    # the op's values are those the forward computed
    services = open_services(settings)
    try:
        tanh = by_name["Net/tanh#1_outputs"]
        stored = np.asarray(services.store.open(tanh.store_key, tanh.digest)[...])
        assert torch.equal(torch.from_numpy(stored), expected)
    finally:
        services.close()


def test_the_first_diverging_op_of_a_port_is_named_with_its_line_on_both_sides(settings: Settings) -> None:
    reference, candidate = models()
    x = torch.randn(2, 5, DIM, generator=torch.Generator().manual_seed(1))
    for model, run in ((reference, "reference"), (candidate, "candidate")):
        with torch.no_grad(), capture(model, "port", run, data_dir=settings.data_dir, level="op") as result:
            model(x)
    assert result.session_id is not None
    report, unmatched = compared(settings, result.session_id)
    assert unmatched == []  # the same ops on both sides: every op pairs, by module path, op and call index
    by_name = {p.name: p for p in report.pairs}
    # the root's class differs: paired by module call and the alignment of its ops, not by name
    tanh = by_name["Net/tanh#1_outputs"]
    assert (tanh.b.name, tanh.strategy) == ("PortedNet/tanh#1_outputs", "module aligned")
    # everything up to the scaled scores of layer 1 is identical
    first = report.first_divergence
    assert first is not None and first.name == "Net.layers.1.self_attn/mul#1_outputs"
    assert (first.reference_source, first.candidate_source) == (line_of("reference scores"), line_of("ported scores"))
    assert by_name["Net.layers.1.self_attn/matmul#1_outputs"].status == "pass"
    assert by_name["Net.layers.1.self_attn/softmax#1_outputs"].status == "fail"
    assert by_name["Net.layers.1.self_attn/softmax#1_outputs"].b.source == line_of("ported softmax")
    # modules still pair and rank: the ported attention is the culprit
    assert report.modules is not None and report.modules.culprit is not None
    assert report.modules.culprit.module_path == "Net.layers.1.self_attn"
    nodes = {n.path: n for root in report.modules.tree for n in walk(root)}
    attention = nodes["Net.layers.1.self_attn"]
    assert attention.failing_inside == 1  # o_proj (its input differs); the failing ops are no modules
    assert [c.name for c in attention.children][3:6] == ["transpose#1", "matmul#1", "mul#1"]  # ops are its leaves
    assert nodes["Net.layers.1.self_attn/mul#1"].verdict == "fail"

    typed = compare_report(result.session_id, "port", "http://127.0.0.1/sessions/1", report, [])
    payload = to_json(typed)
    pair = next(p for p in payload["pairs"] if p["name"] == first.name)
    assert (pair["a"]["source"], pair["b"]["source"]) == (line_of("reference scores"), line_of("ported scores"))
    outputs = next(p for p in payload["pairs"] if p["module_path"] == "Net.layers.1" and p["place"] == "outputs")
    assert outputs["a"]["source"] is None  # a module's outputs have no line (its inputs: the line that called it)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        print_table(typed)
    reference_line, ported_line = (line_of(m).rsplit("/", 1)[1] for m in ("reference scores", "ported scores"))
    assert (
        f"FIRST DIVERGENCE: Net.layers.1.self_attn/mul#1_outputs (layer 1, at {reference_line} in the reference, "
        f"{ported_line} in the candidate): max |diff|"
    ) in printed.getvalue()


def test_modules_limit_the_ops_recorded(settings: Settings) -> None:
    reference, _ = models()
    x = torch.randn(2, 5, DIM)
    with (
        torch.no_grad(),
        capture(reference, "some ops", "r", data_dir=settings.data_dir, level="op", modules="layers.1.self_attn") as r,
    ):
        reference(x)
    assert r.run_id is not None
    names = [t.name for t in rows_of(settings, r.run_id)]
    ops = [n for n in names if "/" in n]
    assert ops == [
        "Net.layers.1.self_attn/transpose#1_outputs",
        "Net.layers.1.self_attn/matmul#1_outputs",
        "Net.layers.1.self_attn/mul#1_outputs",
        "Net.layers.1.self_attn/softmax#1_outputs",
        "Net.layers.1.self_attn/matmul#2_outputs",
    ]  # not the projections' (q_proj is not selected), not the blocks' nor the root's
    assert names[0] == "Net_inputs_args_0" and names[-1] == "Net_outputs"  # the model itself is always recorded
    assert names.index("Net.layers.1.self_attn_inputs_args_0") < names.index(ops[0])
    assert names.index(ops[-1]) < names.index("Net.layers.1.self_attn_outputs")


def test_module_level_records_no_op_and_an_unknown_level_is_refused(settings: Settings) -> None:
    reference, _ = models()
    with torch.no_grad(), capture(reference, "modules", "r", data_dir=settings.data_dir) as result:
        reference(torch.randn(2, 5, DIM))
    assert result.run_id is not None
    rows = rows_of(settings, result.run_id)
    assert rows and not any("/" in r.name for r in rows)
    assert not any(r.source for r in rows if not (r.place or "").startswith("inputs"))  # inputs: the caller's line
    refused = pytest.raises(ValueError, match="capture level must be one of module, op, got 'ops'")
    with refused, capture(reference, "modules", "r2", data_dir=settings.data_dir, level="ops"):
        pass


def test_op_capture_through_the_server_keeps_each_ops_source(shared_server: LiveServer) -> None:
    reference, candidate = models()
    x = torch.randn(1, 4, DIM, generator=torch.Generator().manual_seed(2))
    for model, run in ((reference, "reference"), (candidate, "candidate")):
        with torch.no_grad(), capture(model, "ops over http", run, server=shared_server.url, level="op") as result:
            model(x)
    assert result.session_id is not None
    with httpx.Client(base_url=shared_server.url, timeout=30) as client:
        report: dict[str, Any] = wait_until(
            lambda: client.get(f"/api/sessions/{result.session_id}/pairs").json(),
            until=lambda r: r["pairs"] and not r["progress"]["pending"],
            what="the captured session's pairs to be computed",
            timeout=120,
            interval=0.03,
        )
        first = report["first_divergence"]
        assert first["name"] == "Net.layers.1.self_attn/mul#1_outputs"
        assert (first["reference_source"], first["candidate_source"]) == (
            line_of("reference scores"),
            line_of("ported scores"),
        )
        pair = next(p for p in report["pairs"] if p["id"] == first["pair_id"])
        assert pair["a"]["source"] == line_of("reference scores")
        page = client.get(f"/pairs/{first['pair_id']}").text
        reference_line, ported_line = (line_of(m).rsplit("/", 1)[1] for m in ("reference scores", "ported scores"))
        assert f">{reference_line}</code> in the reference, " in page and f">{ported_line}</code> in" in page
        assert "<h2>Ops inside Net.layers.1.self_attn</h2>" in page  # the ops around it, side by side
        assert "(the candidate's PortedNet.layers.1.self_attn)" in page
        assert "only in the" not in page  # the same ops on both sides
        assert page.count('class="verdict-fail first-divergence"') == 1  # this op's row
        session_page = client.get(f"/sessions/{result.session_id}").text
        assert f"at {reference_line} in the reference, {ported_line} in the candidate" in session_page
        # the module tree goes down to the ops, each with its lines; the first diverging one is marked
        op_node = session_page.split('data-module="Net.layers.1.self_attn/mul#1"', 1)[1].split("</details>", 1)[0]
        assert f'<li class="first-divergence"><a href="/pairs/{first["pair_id"]}">outputs</a>' in op_node
        assert "first divergence</strong>" in op_node
        assert f">{reference_line}</code>, candidate <code" in op_node and f">{ported_line}</code>" in op_node
        assert session_page.count('<li class="first-divergence">') == 1


def test_an_op_one_side_alone_calls_is_left_unpaired_and_the_rest_pair(settings: Settings) -> None:
    """Ops one side calls and the other does not (an extra cast) are left unpaired, in place; the rest pair."""
    reference, _ = models()

    class CastingAttention(Attention):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
            scores = torch.matmul(q, k.transpose(-1, -2)).float() * self.scaling
            weights = F.softmax(scores, dim=-1)
            out: torch.Tensor = self.o_proj(weights @ v)
            return out

    candidate = Net()
    candidate.layers[1].self_attn = CastingAttention()
    candidate.load_state_dict(reference.state_dict())
    x = torch.randn(2, 5, DIM)
    for model, run in ((reference, "reference"), (candidate, "candidate")):
        with torch.no_grad(), capture(model, "cast", run, data_dir=settings.data_dir, level="op") as result:
            model(x)
    assert result.session_id is not None
    report, unmatched = compared(settings, result.session_id)
    assert unmatched == ["Net.layers.1.self_attn/float#1_outputs"]
    assert report.first_divergence is None  # a float32 cast of float32 values changes nothing
    # the attention's pair page lists both sides' ops, aligned, the cast in place facing a gap
    module_pair = next(p for p in report.pairs if p.name == "Net.layers.1.self_attn_outputs")
    services = open_services(settings)
    try:
        with services.sessions() as db:
            record = db.get_one(PairRecord, module_pair.id)
            lists = op_lists(db, record, *tensors_of(db, record))
    finally:
        services.close()
    assert lists is not None and lists.current is None
    rows = [(r.a.name if r.a else None, r.b.name if r.b else None, r.status) for r in lists.rows]
    assert rows == [
        ("q_proj/linear#1", "q_proj/linear#1", "pass"),
        ("k_proj/linear#1", "k_proj/linear#1", "pass"),
        ("v_proj/linear#1", "v_proj/linear#1", "pass"),
        ("transpose#1", "transpose#1", "pass"),
        ("matmul#1", "matmul#1", "pass"),
        (None, "float#1", None),  # the candidate alone casts, here
        ("mul#1", "mul#1", "pass"),
        ("softmax#1", "softmax#1", "pass"),
        ("matmul#2", "matmul#2", "pass"),
        ("o_proj/linear#1", "o_proj/linear#1", "pass"),
    ]
    assert lists.rows[7].a is not None and lists.rows[7].a.source == line_of("reference softmax")


def test_a_capture_of_some_modules_leaves_the_rest_allowed_and_what_it_lacks_inside_them_unmatched(
    settings: Settings,
) -> None:
    """A second capture of one module (`modules=`, as the next-capture snippet gives) records nothing else by the
    user's choice: the reference's other tensors are allowed to have no partner there, and the session is not
    called incomplete for them; a reference op inside the module that the candidate does not run stays unmatched."""
    reference, _ = models()

    class Unscaled(Attention):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
            weights = F.softmax(torch.matmul(q, k.transpose(-1, -2)), dim=-1)
            out: torch.Tensor = self.o_proj(weights @ v)
            return out

    candidate = Net()
    candidate.layers[1].self_attn = Unscaled()
    candidate.load_state_dict(reference.state_dict())
    x = torch.randn(2, 5, DIM)
    with torch.no_grad(), capture(reference, "scope", "reference", data_dir=settings.data_dir, level="op"):
        reference(x)
    with (
        torch.no_grad(),
        capture(
            candidate, "scope", "attention", data_dir=settings.data_dir, level="op", modules="layers.1.self_attn*"
        ) as result,
    ):
        candidate(x)
    assert result.session_id is not None
    report, unmatched = compared(settings, result.session_id)
    assert report.coverage.unmatched == ["Net.layers.1.self_attn/mul#1_outputs"]
    assert "Net.layers.0.mlp_outputs" in report.coverage.allowed_unmatched
    assert "Net.layers.2.self_attn/softmax#1_outputs" in report.coverage.allowed_unmatched
    assert not any(n.startswith("Net.layers.1.self_attn") for n in report.coverage.allowed_unmatched)
    assert len(unmatched) == len(report.coverage.unmatched) + len(report.coverage.allowed_unmatched)
    # the one candidate compared none of the tensors it was not asked for: they are not compared, by its choice
    (run,) = report.coverage.runs
    assert (run.run, run.against, run.not_asked) == ("attention", "reference", len(report.coverage.allowed_unmatched))
    assert run.tensors == report.coverage.reference_tensors - run.not_asked == run.compared + 1  # + the unmatched
    assert report.coverage.compared == run.compared
    assert report.verdict.value == "diverged"  # the softmax's inputs differ without the scale


def test_an_op_only_the_candidate_runs_is_named_with_its_line_before_the_first_divergence(settings: Settings) -> None:
    """The candidate's extra op (a `pow` the reference never calls) has no partner: the first pair to fail is the
    op after it, and the first divergence names the extra op and its line, in the report, the JSON and the CLI."""
    reference, _ = models()

    class SharpenedAttention(Attention):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
            scores = torch.matmul(q, k.transpose(-1, -2)) * self.scaling
            weights = F.softmax(scores, dim=-1).pow(1.5)  # extra op of the port
            out: torch.Tensor = self.o_proj(weights @ v)
            return out

    candidate = Net()
    candidate.layers[1].self_attn = SharpenedAttention()
    candidate.load_state_dict(reference.state_dict())
    x = torch.randn(2, 5, DIM)
    for model, run in ((reference, "reference"), (candidate, "candidate")):
        with torch.no_grad(), capture(model, "sharp", run, data_dir=settings.data_dir, level="op") as result:
            model(x)
    assert result.session_id is not None
    report, unmatched = compared(settings, result.session_id)
    assert unmatched == ["Net.layers.1.self_attn/pow#1_outputs"]
    first = report.first_divergence
    assert first is not None and first.name == "Net.layers.1.self_attn/matmul#2_outputs", first
    extra = f"Net.layers.1.self_attn/pow#1_outputs ({line_here('extra op of the port')})"
    assert first.candidate_only_before == [extra]
    typed = compare_report(result.session_id, "sharp", "http://127.0.0.1/sessions/1", report, [])
    assert to_json(typed)["first_divergence"]["candidate_only_before"] == [extra]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        print_table(typed)
    assert f"before it, the candidate recorded what the reference did not: {extra}" in printed.getvalue()
    assert first.first_changed is None  # every pair before it is bit-identical
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:
        page = client.get(f"/sessions/{result.session_id}")
    assert page.status_code == 200
    banner = page.text.split('class="candidate-only-before"', 1)[1].split("</span>", 1)[0]
    assert "Before it, the candidate recorded what the reference did not:" in banner
    assert "Net.layers.1.self_attn/pow#1_outputs" in banner


@pytest.mark.parametrize("values", ["full", "summary"])
def test_the_first_change_within_tolerance_is_named_before_the_first_divergence(
    settings: Settings, values: str
) -> None:
    """The pairs before the divergence pass, but the first of them whose values differ at all (max |diff| above 0,
    or summaries' hashes that differ) is where the difference began: the report, the JSON and the CLI name it. Judged
    on summaries alone it is not said to be within tolerance (the summaries bound max |diff| from below): only that
    they found nothing outside it."""
    x = torch.randn(2, 5, DIM)
    for model, run in ((Drift(0.0), "reference"), (Drift(1e-6), "candidate")):
        with (
            torch.no_grad(),
            capture(model, "drift", run, data_dir=settings.data_dir, level="op", values=values) as result,
        ):
            model(x)
    assert result.session_id is not None
    report, _ = compared(settings, result.session_id)
    first = report.first_divergence
    assert first is not None and first.name == "Drift/mul#1_outputs", first
    changed = f"Drift/add#1_outputs ({line_of('drift begins')})"
    assert first.first_changed == changed
    typed = compare_report(result.session_id, "drift", "http://127.0.0.1/sessions/1", report, [])
    assert to_json(typed)["first_divergence"]["first_changed"] == changed
    assert to_json(typed)["first_divergence"]["first_changed_on_summaries"] == (values == "summary")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        print_table(typed)
    if values == "full":
        said = f"the first tensor whose values differ at all is {changed}, within tolerance there"
    else:
        said = f"the first tensor whose values differ at all (content hashes) is {changed}; its summaries found nothing"
        assert "within tolerance there" not in printed.getvalue()
    assert said in printed.getvalue()


def repeat_kv(hidden_states: torch.Tensor, n_rep: int) -> torch.Tensor:
    """transformers' repeat_kv, copied into the port."""
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


def ported_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' eager_attention_forward copied into a port, with a wrong softmax scale in layer 1."""
    key_states = repeat_kv(key, module.num_key_value_groups)
    value_states = repeat_kv(value, module.num_key_value_groups)
    scale = scaling * 1.25 if module.layer_idx == 1 else scaling
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scale  # ported llama scores
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value_states)
    attn_output = attn_output.transpose(1, 2).contiguous()
    return attn_output, attn_weights


def test_a_tiny_llama_and_its_port_diverge_first_at_layer_1s_scaled_scores(settings: Settings) -> None:
    import transformers.models.llama.modeling_llama as modeling_llama
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    # the documented way to plug in an attention function (with the eager attention's mask)
    AttentionInterface.register("tensor_debugger_ported", ported_attention)
    AttentionMaskInterface.register("tensor_debugger_ported", eager_mask)
    reference, candidate = tiny_llama(), tiny_llama(attention="tensor_debugger_ported")
    for model, run in ((reference, "reference"), (candidate, "candidate")):
        with torch.no_grad(), capture(model, "llama port", run, data_dir=settings.data_dir, level="op") as result:
            model(input_ids())
    assert result.session_id is not None
    report, unmatched = compared(settings, result.session_id)
    # every op of both forwards pairs, but for the mask's slicing, which the eager attention of some transformers
    # releases does (4.53: `attention_mask[:, :, :, : key_states.shape[-2]]`) and the port does not
    assert all("/getitem#" in name for name in unmatched) and len(unmatched) <= 2 and len(report.pairs) > 200
    first = report.first_divergence
    assert first is not None and first.layer == 1
    assert first.name == f"{MODEL_CLASS}.model.layers.1.self_attn/mul#5_outputs"  # after the rotary embedding's 4
    lines = Path(modeling_llama.__file__).read_text(encoding="utf-8").splitlines()
    reference_file, reference_line = (first.reference_source or "").rsplit(":", 1)
    assert reference_file == modeling_llama.__file__
    assert "torch.matmul(query, key_states.transpose(2, 3)) * scaling" in lines[int(reference_line) - 1]
    assert first.candidate_source == line_here("ported llama scores")
    layer_0 = [p for p in report.pairs if ".layers.0." in p.name and "/" in p.name]
    assert layer_0 and all(p.status == "pass" for p in layer_0)
