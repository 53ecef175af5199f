"""`capture(values="summary")`: summaries computed where the tensor lives, no bytes stored; pairs judged on them
(and never claimed as more); the second capture they call for; `find_divergence`'s two passes. Real models: a
hand-written attention block with a planted softmax-scale bug (tests/support/op_models.py) and a tiny Llama
built by transformers with a planted change."""

from __future__ import annotations

import contextlib
import gc
import io
import math
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from numpy.typing import NDArray
from sqlalchemy import select
from tensor_debugger import capture, find_divergence
from tensor_debugger.cli.compare_output import print_table
from tensor_debugger.compare.reports.compare_report import to_json
from tensor_debugger.compare.reports.contract import compare_report
from tensor_debugger.compare.reports.divergence_words import FOUND_BY_FIND_DIVERGENCE
from tensor_debugger.engine.summary_compare import Sketch, compare_sketches, sample_positions
from tensor_debugger.engine.tolerances import Tolerance
from tensor_debugger.ingest.fold64 import content_hash
from tensor_debugger.ingest.sketches import record_sketch, sketch
from tensor_debugger.live.divergence import ChangingModelError, _full_stats
from tensor_debugger.live.ops import OpMode
from tensor_debugger.live.recorder import record, summarize_forward
from tensor_debugger.services import open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store.models import PairRecord, ProblemRecord, RunRecord, SessionRecord, TensorRecord
from torch import nn

from tests.support.op_models import DIM, Drift, line_of, models
from tests.support.polling import wait_until
from tests.support.servers import LiveServer
from tests.support.sessions import compared, rows_of
from tests.support.traces import input_ids, tiny_llama

TOL = Tolerance(1.3e-6, 1e-5)


def x_input() -> torch.Tensor:
    return torch.randn(2, 5, DIM, generator=torch.Generator().manual_seed(1))


# --- summaries ------------------------------------------------------------------------------------------------


def test_a_summary_is_exact_where_it_can_be_and_samples_the_same_positions_on_both_sides() -> None:
    t = torch.randn(3, 1000, generator=torch.Generator().manual_seed(0))
    t[0, 5] = float("nan")
    t[1, 7] = float("inf")
    s = sketch(t)
    finite = t[torch.isfinite(t)].double()
    assert (s.numel, s.count, s.nan, s.inf) == (3000, 2998, 1, 1)
    assert s.sum == pytest.approx(float(finite.sum()), rel=1e-9, abs=1e-9)
    assert s.sumsq == pytest.approx(float((finite * finite).sum()), rel=1e-12)
    on_device = sketch(t, "fold64")  # what a GPU computes with torch: the same numbers, its own hash
    assert on_device.hash == content_hash(t) and on_device.hash.startswith("fold64:")
    assert (on_device.count, on_device.nan, on_device.inf, on_device.sample) == (s.count, s.nan, s.inf, s.sample)
    assert on_device.sum == pytest.approx(s.sum, rel=1e-9, abs=1e-9)
    assert on_device.sumsq == pytest.approx(s.sumsq, rel=1e-12)
    assert (on_device.min, on_device.max) == (s.min, s.max)
    assert (s.min, s.max) == (float(finite.min()), float(finite.max()))
    positions = sample_positions(3000)
    assert len(positions) > 200 and positions == sorted(positions) and positions == sample_positions(3000)
    flat = t.reshape(-1).double()
    assert all(
        (math.isnan(v) and math.isnan(flat[p])) or v == float(flat[p]) for v, p in zip(s.sample, positions, strict=True)
    )
    assert sample_positions(10) == list(range(10))
    assert Sketch.from_json(s.to_json()) == s  # NaN and Inf survive JSON as strings
    # the hashes: the same bytes hash equal; one flipped bit, another dtype or shape do not
    u = t.clone()
    assert (sketch(u).hash, content_hash(u)) == (s.hash, on_device.hash)
    u.view(torch.int32)[2, 999] ^= 1
    assert sketch(u).hash != s.hash and content_hash(u) != on_device.hash
    assert content_hash(t.reshape(1000, 3)) != on_device.hash and sketch(t.reshape(1000, 3)).hash != s.hash
    assert content_hash(torch.zeros(4, dtype=torch.int32)) != content_hash(torch.zeros(4, dtype=torch.float32))
    # a strided view hashes as its values do
    assert content_hash(t[:, ::2]) == content_hash(t[:, ::2].contiguous())
    odd = torch.arange(7, dtype=torch.uint8)  # bytes not a multiple of 8
    assert content_hash(odd) != content_hash(torch.tensor([0, 1, 2, 3, 4, 5, 9], dtype=torch.uint8))


def test_the_second_pass_hashes_are_the_summary_captures_hashes() -> None:
    """find_divergence's second pass hashes every tensor as it records full values of some, and checks each hash
    against the first pass's summary: the hash-only recorder gives exactly a summary capture's hashes."""
    reference, _ = models()
    model = reference.eval()
    x = x_input()
    with torch.no_grad():
        alone = summarize_forward(model, lambda: model(x), "op")
        with record(model, level="op", values="full", modules=["layers.1.self_attn*"], hashes=True) as run:
            model(x)
    assert run.hashes and run.hashes == {name: s.hash for name, s in alone.summaries.items()}
    assert run.tensors and all(name.startswith("Net.layers.1.self_attn") or "/" not in name for name in run.tensors)


def test_summary_verdicts_prove_failures_and_call_a_pass_no_difference_found() -> None:
    a = torch.randn(4096, generator=torch.Generator().manual_seed(0))
    same = compare_sketches(sketch(a), sketch(a.clone()), TOL)
    assert same.passed and same.identical and "bit-identical" in same.reason
    # a tiny change everywhere, within tolerance: no difference found, never "identical"
    near = compare_sketches(sketch(a), sketch(a * (1 + 1e-7)), TOL)
    assert near.passed and not near.identical
    assert near.reason.startswith("from summaries: no difference found in the summary")
    # one element off, not sampled: the summary cannot see it, and does not claim to have compared it
    b = a.clone()
    unsampled = next(i for i in range(4096) if i not in set(sample_positions(4096)))
    b[unsampled] += 1e-3
    missed = compare_sketches(sketch(a), sketch(b), TOL)
    assert missed.passed and "not every element was compared" in missed.reason
    # a scale error: sampled elements fail, and their max |diff| is a lower bound of the true one
    c = a * 1.01
    scaled = compare_sketches(sketch(a), sketch(c), TOL)
    assert not scaled.passed and scaled.sampled_mismatched > 0
    assert scaled.sampled_max_abs_diff is not None
    assert scaled.sampled_max_abs_diff <= float((c - a).abs().max())
    assert scaled.rel_norm_diff == pytest.approx(0.01, rel=1e-6)
    # NaN counts, shapes
    d = a.clone()
    d[unsampled] = float("nan")
    assert not compare_sketches(sketch(a), sketch(d), TOL).passed
    assert not compare_sketches(sketch(a), sketch(a.reshape(64, 64)), TOL).shapes_equal
    # a loose tolerance lets a 1% change pass the norm and the sampled checks
    assert compare_sketches(sketch(a), sketch(c), Tolerance(0.02, 1e-5)).passed


def test_a_summary_capture_stores_no_bytes_and_finds_the_same_first_op_as_a_full_one(settings: Settings) -> None:
    reference, candidate = models()
    x = x_input()
    for values in ("summary", "full"):
        for model, run in ((reference, "reference"), (candidate, "candidate")):
            with (
                torch.no_grad(),
                capture(model, f"port {values}", run, data_dir=settings.data_dir, level="op", values=values) as result,
            ):
                model(x)
            if values == "summary":
                assert result.run_id is not None
                rows = rows_of(settings, result.run_id)
                assert rows and all(r.store_key == "" and r.nbytes == 0 and not r.has_values for r in rows)
                assert all(r.sketch is not None for r in rows)
                softmax = next(r for r in rows if r.name.endswith("layers.1.self_attn/softmax#1_outputs"))
                assert softmax.source is not None and softmax.layer == 1
        assert result.session_id is not None
        report = compared(settings, result.session_id, modules=True)
        first = report.first_divergence
        assert first is not None and first.name == "Net.layers.1.self_attn/mul#1_outputs"
        assert (first.reference_source, first.candidate_source) == (
            line_of("reference scores"),
            line_of("ported scores"),
        )
        by_name = {p.name: p for p in report.pairs}
        if values == "summary":
            assert first.basis == "summary" and first.summary_reason is not None
            assert first.summary_reason.startswith("from summaries: ")
            assert getattr(by_name["Net.layers.1.self_attn/matmul#1_outputs"].summary, "identical", None) is True
            assert report.on_summaries == len(report.pairs)
            typed = compare_report(result.session_id, "port summary", "http://x/sessions/1", report, [])
            payload = to_json(typed)
            assert payload["basis"] == "summary" and payload["first_divergence"]["basis"] == "summary"
            assert payload["next_capture"]["modules"] == ["layers.1.self_attn*"]
            assert 'values="full"' in payload["next_capture"]["python"]
            assert "modules='layers.1.self_attn*'" in payload["next_capture"]["python"]
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                print_table(typed)
            out = printed.getvalue()
            assert "FIRST DIVERGENCE: Net.layers.1.self_attn/mul#1_outputs (layer 1, at" in out
            assert "): from summaries: " in out and "next capture" in out
            assert "NO DIFFERENCE FOUND (summary)" in out
        else:
            assert first.basis is None and report.on_summaries == 0


def test_a_full_dump_pairs_with_a_summary_capture_of_the_other_side(settings: Settings) -> None:
    reference, candidate = models()
    x = x_input()
    with torch.no_grad(), capture(reference, "mixed", "reference", data_dir=settings.data_dir, level="op") as ref:
        reference(x)
    with (
        torch.no_grad(),
        capture(candidate, "mixed", "candidate", data_dir=settings.data_dir, level="op", values="summary") as cand,
    ):
        candidate(x)
    assert cand.session_id is not None and ref.run_id is not None
    report = compared(settings, cand.session_id, modules=True)
    first = report.first_divergence
    assert first is not None and first.name == "Net.layers.1.self_attn/mul#1_outputs" and first.basis == "summary"
    # the stored side's summary, computed from its values read back, equals the one the capture would keep
    services = open_services(settings)
    try:
        with services.sessions() as db:
            row = db.scalars(
                select(TensorRecord).where(
                    TensorRecord.run_id == ref.run_id, TensorRecord.name == "Net.layers.0.self_attn/softmax#1_outputs"
                )
            ).one()
            from_store = record_sketch(services.store, row, "fold64")
    finally:
        services.close()
    kept = cand.summaries["PortedNet.layers.0.self_attn/softmax#1_outputs"]
    assert from_store is not None and from_store.hash == kept.hash and from_store.sample == kept.sample
    # a CPU summary's hash is the "fold64" hash ingest keeps beside the stored bytes' digest
    assert row.sketch is not None and kept.hash == row.sketch["fold64"] and kept.hash.startswith("fold64:")


def test_a_tiny_llama_summary_pass_and_full_pass_agree_on_the_first_diverging_op(settings: Settings) -> None:
    firsts = {}
    for values in ("summary", "full"):
        for run, scale in (("reference", None), ("candidate", "model.layers.1.self_attn.v_proj.weight")):
            model = tiny_llama(scale=scale).eval()
            with (
                torch.no_grad(),
                capture(model, f"llama {values}", run, data_dir=settings.data_dir, level="op", values=values) as r,
            ):
                model(input_ids())
        assert r.session_id is not None
        report = compared(settings, r.session_id, modules=True)
        assert report.first_divergence is not None
        firsts[values] = (report.first_divergence.name, report.first_divergence.reference_source)
    assert firsts["summary"] == firsts["full"]
    assert firsts["summary"][0].startswith("LlamaForCausalLM.model.layers.1.self_attn.v_proj/linear#1")
    assert firsts["summary"][1] is not None and "modeling_llama.py:" in firsts["summary"][1]


# --- find_divergence ------------------------------------------------------------------------------------------


class InPlace(nn.Module):
    """Changes tensors in place after the op that made them was recorded: by method, operator, item assignment,
    `out=` and `inplace=True`, each right after a large op; and a view summarised from the tensor it views."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        y.add_(1)
        z = y.exp()
        z += 1
        w = z.sin()
        w[0] = 7.0
        v = w.cos()
        torch.mul(v, 3, out=v)
        u = v - 0.5
        nn.functional.relu(u, inplace=True)
        t = u.view(-1)  # a view: its summary, then a change through the tensor it views
        u.mul_(2)
        return t * 1


def test_op_summaries_are_of_the_values_each_op_made_though_later_ops_change_them_in_place(settings: Settings) -> None:
    model = InPlace().eval()
    x = torch.randn(64, 1 << 14, generator=torch.Generator().manual_seed(3))  # 4 MB a tensor
    kept: dict[str, torch.Tensor] = {}

    def keep(name: str, tensor: torch.Tensor) -> None:
        kept[name] = tensor.detach().clone()

    with torch.no_grad(), capture(model, "in place", "full", data_dir=settings.data_dir, level="op", on_tensor=keep):
        model(x)
    for attempt in range(3):  # each run again: a summary reused while its tensor changed would show here
        with (
            torch.no_grad(),
            capture(
                model, "in place", f"summary {attempt}", data_dir=settings.data_dir, level="op", values="summary"
            ) as result,
        ):
            model(x)
        assert list(result.summaries) == list(kept)  # every tensor, in call order
        for name, value in kept.items():
            assert result.summaries[name] == sketch(value, "fold64"), name
        alone = summarize_forward(model, lambda: model(x), "op")
        assert alone.summaries == result.summaries
    assert "InPlace/add_#1_outputs" in kept and "InPlace/setitem#1_outputs" not in kept  # None: not recorded


class Unseen(nn.Module):
    """Changes an op's output after the op, through `.numpy()`: no torch call, so no op mode sees it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        y.numpy()[:] = 0.0  # the op's values gone right after the op
        return y + 1


def test_an_ops_summary_is_of_its_values_though_code_torch_cannot_see_changes_them_after(settings: Settings) -> None:
    x = torch.randn(64, 1 << 14, generator=torch.Generator().manual_seed(4))
    model = Unseen()
    with (
        torch.no_grad(),
        capture(model, "unseen", "s", data_dir=settings.data_dir, level="op", values="summary") as result,
    ):
        model(x)
    assert result.summaries["Unseen/mul#1_outputs"] == sketch(x * 2, "fold64")  # not of the zeros written after it


class Strided(nn.Module):
    """q, k and v split from one fused projection (strided views of it), each viewed as heads: q's view reads the
    same elements in the same order as q (its summary q's, reshaped), k's transposed one does not; then q changed
    in place, and viewed as heads again."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = torch.split(x * 1.5, 48, dim=-1)  # each (2, 300, 48), stride 144
        heads = q.view(2, 300, 4, 12)
        turned = k.view(2, 300, 4, 12).transpose(1, 2)
        q.mul_(2)
        again = q.view(2, 300, 4, 12)
        out: torch.Tensor = heads + turned.transpose(1, 2) + again + v.reshape(2, 300, 4, 12)
        return out


def test_a_strided_view_is_summarised_as_the_tensor_it_reads_in_the_same_order(settings: Settings) -> None:
    """Each summary is of the values its op made, whether taken from the strided tensor it views (q's heads), or
    computed (the transposed heads, another order of the same bytes; q's heads after q changed in place)."""
    model = Strided()
    x = torch.randn(2, 300, 144, generator=torch.Generator().manual_seed(5))
    kept: dict[str, torch.Tensor] = {}

    def keep(name: str, tensor: torch.Tensor) -> None:
        kept[name] = tensor.detach().clone()

    with torch.no_grad(), capture(model, "strided", "full", data_dir=settings.data_dir, level="op", on_tensor=keep):
        model(x)
    with (
        torch.no_grad(),
        capture(model, "strided", "summary", data_dir=settings.data_dir, level="op", values="summary") as result,
    ):
        model(x)
    assert list(result.summaries) == list(kept)
    for name, value in kept.items():
        assert result.summaries[name] == sketch(value, "fold64"), name
    q, heads, turned = (
        result.summaries[f"Strided/{op}"] for op in ("split#1_outputs_0", "view#1_outputs", "transpose#1_outputs")
    )
    assert heads.hash != q.hash and (heads.sum, heads.sample) == (q.sum, q.sample)  # the same values, reshaped
    assert result.summaries["Strided/view#3_outputs"].sum == 2 * heads.sum  # q's heads again, after q.mul_(2)
    assert turned.sample != result.summaries["Strided/view#2_outputs"].sample  # another order


class Buffered(nn.Module):
    """An output buffer allocated empty and filled afterwards, as fused-kernel wrappers do."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        out.copy_(x * 3)
        return out


def test_memory_allocated_without_values_is_not_recorded_and_find_divergence_accepts_it(settings: Settings) -> None:
    """`torch.empty_like`'s bytes are whatever the memory held: recorded, they differed between two calls of the same
    model, and `find_divergence` refused it as a model that changes."""
    model = Buffered().eval()
    found = find_divergence(model, model, (x_input(),), session="empty", data_dir=settings.data_dir)
    assert found.first is None
    alone = summarize_forward(model, lambda: model(x_input()), "op")
    assert not any("empty" in name for name in alone.summaries), list(alone.summaries)
    assert "Buffered/copy_#1_outputs" in alone.summaries


def test_find_divergence_names_the_op_its_lines_and_the_culprit_from_two_passes(settings: Settings) -> None:
    reference, candidate = models()
    found = find_divergence(
        reference.eval(), candidate.eval(), (x_input(),), session="found", data_dir=settings.data_dir
    )
    first = found.first
    assert first is not None
    assert (first.reference, first.candidate) == (
        "Net.layers.1.self_attn/mul#1_outputs",
        "PortedNet.layers.1.self_attn/mul#1_outputs",
    )
    assert (first.module, first.op) == ("Net.layers.1.self_attn", "mul")
    assert (first.reference_source, first.candidate_source) == (line_of("reference scores"), line_of("ported scores"))
    assert not first.summary.passed
    # the second pass compared full values of the module and of the one that made its input
    assert found.full_modules == ("layers.1.self_attn*", "layers.1.norm*")
    assert first.full is not None and not first.full.passed and first.full.mismatched > 0
    assert found.culprits == ["Net.layers.1.self_attn"]
    assert found.location == str(settings.data_dir)
    assert found.runs == ("reference", "candidate", "reference (full)", "candidate (full)")
    text = repr(found)
    assert "The first divergence is Net.layers.1.self_attn/mul#1_outputs" in text and "from summaries" in text
    assert "From full values: max |diff|" in text and found._repr_html_().startswith("<p>")
    assert found.next_capture is not None and "modules=['layers.1.self_attn*', 'layers.1.norm*']" in found.next_capture
    # the session's runs are paired when it returns (once, after its last capture)
    services = open_services(settings)
    try:
        with services.sessions() as db:
            runs = {r.label: r.id for r in db.scalars(select(RunRecord))}
            against = {r.label: r.compared_against_id for r in db.scalars(select(RunRecord))}
            paired = {(a, b) for a, b in db.execute(select(PairRecord.run_a_id, PairRecord.run_b_id))}
    finally:
        services.close()
    assert set(runs) == set(found.runs)
    # the full candidate against the full reference (element by element), the others against the summaries
    assert against == {
        "reference": None,
        "candidate": None,
        "reference (full)": None,
        "candidate (full)": runs["reference (full)"],
    }
    assert paired == {
        (runs["reference"], runs["candidate"]),
        (runs["reference"], runs["reference (full)"]),
        (runs["reference (full)"], runs["candidate (full)"]),
    }
    # all four runs in one session
    report = compared(settings, 1, modules=True)
    assert report.first_divergence is not None
    # the full runs recorded the two modules asked for: the reference's other tensors have no partner there by
    # that choice, not by accident (allowed, not unmatched); the summary candidate paired every one
    assert report.coverage.unmatched == [], report.coverage.unmatched[:5]
    full_runs = {runs["reference (full)"], runs["candidate (full)"]}
    left_out = [u for u in report.unmatched if u.against_run_id in full_runs and u.run_id == runs["reference"]]
    assert left_out and all(u.allowed for u in left_out)
    assert not any(u.against_run_id == runs["candidate"] for u in report.unmatched)
    # what was compared, per run against the run it is compared against: the summary candidate compared every
    # reference tensor, so the tensors the full runs were not asked to record take nothing from the session's
    # coverage (it read 23 of 114 compared, each of the 91 others "allowed to have no partner")
    coverage = report.coverage
    services = open_services(settings)
    try:
        with services.sessions() as db:
            held = {
                label: {n for (n,) in db.execute(select(TensorRecord.name).where(TensorRecord.run_id == runs[label]))}
                for label in runs
            }
    finally:
        services.close()
    assert coverage.reference_tensors == len(held["reference"]) > len(held["reference (full)"]) > 0
    assert coverage.compared == coverage.reference_tensors and coverage.allowed_unmatched == []
    by_run = {(r.run, r.against): (r.tensors, r.compared, r.not_asked) for r in coverage.runs}
    n, full = len(held["reference"]), len(held["reference (full)"])
    assert by_run == {
        ("candidate", "reference"): (n, n, 0),
        ("reference (full)", "reference"): (full, full, n - full),
        ("candidate (full)", "reference (full)"): (full, full, 0),
    }, by_run
    assert "Net.layers.0.mlp_outputs" not in held["reference (full)"]
    assert report.verdict == "diverged"


def test_find_divergences_full_passes_stop_after_the_modules_asked_for_with_the_values_a_whole_pass_stores(
    settings: Settings,
) -> None:
    reference, candidate = models()
    reference.eval(), candidate.eval()
    found = find_divergence(reference, candidate, (x_input(),), session="stop", data_dir=settings.data_dir)
    assert found.full_modules == ("layers.1.self_attn*", "layers.1.norm*")
    # the same modules captured by a whole pass, which records on to the model's outputs
    for model, label in ((reference, "reference whole"), (candidate, "candidate whole")):
        with (
            torch.no_grad(),
            capture(model, "whole", label, data_dir=settings.data_dir, level="op", modules=list(found.full_modules)),
        ):
            model(x_input())
    services = open_services(settings)
    try:
        with services.sessions() as db:
            runs = {r.label: r.id for r in db.scalars(select(RunRecord))}

            def stored(label: str) -> dict[str, NDArray[Any]]:
                rows = db.scalars(
                    select(TensorRecord).where(TensorRecord.run_id == runs[label]).order_by(TensorRecord.position)
                )
                return {t.name: np.asarray(services.store.open(t.store_key, t.digest)[...]) for t in rows}

            values = {label: stored(label) for label in ("reference (full)", "candidate (full)")}
            whole = {label: stored(label) for label in ("reference whole", "candidate whole")}
            notes = {
                label: [p.reason for p in db.scalars(select(ProblemRecord).where(ProblemRecord.run_id == runs[label]))]
                for label in ("reference", "reference (full)", "candidate (full)", "reference whole")
            }
            summary_names = [
                t.name for t in db.scalars(select(TensorRecord).where(TensorRecord.run_id == runs["reference"]))
            ]
    finally:
        services.close()
    assert "Net_outputs" in summary_names and notes["reference"] == notes["reference whole"] == []
    for side, root in (("reference", "Net"), ("candidate", "PortedNet")):
        full, complete = values[f"{side} (full)"], whole[f"{side} whole"]
        # every tensor of the modules asked for, bit for bit as the whole pass stored it; nothing after them
        assert f"{root}.layers.1.self_attn/mul#1_outputs" in full and f"{root}.layers.1.self_attn_outputs" in full
        assert list(complete) == [*full, f"{root}_outputs"]
        for name, array in full.items():
            assert array.dtype == complete[name].dtype and np.array_equal(array, complete[name]), name
        stopped = (
            f"recorded modules layers.1.self_attn*, layers.1.norm* only, up to {root}.layers.1.self_attn_outputs, the "
            "last tensor of theirs: the forward was stopped after it, so nothing after it (the model's outputs among "
            "them) was recorded"
        )
        # the candidate's also says find_divergence checked what needs the models (no session sentence sends there)
        assert notes[f"{side} (full)"] == [stopped, *([FOUND_BY_FIND_DIVERGENCE] if side == "candidate" else [])]


def test_find_divergence_of_a_tiny_llama(settings: Settings) -> None:
    reference = tiny_llama().eval()
    candidate = tiny_llama(scale="model.layers.1.mlp.up_proj.weight").eval()
    found = find_divergence(
        reference, candidate, {"input_ids": input_ids()}, session="llama", data_dir=settings.data_dir
    )
    assert found.first is not None
    assert found.first.reference == "LlamaForCausalLM.model.layers.1.mlp.up_proj/linear#1_outputs"
    assert found.first.module == "LlamaForCausalLM.model.layers.1.mlp.up_proj"
    assert found.first.reference_source is not None and "modeling_llama.py:" in found.first.reference_source
    assert found.first.full is not None and not found.first.full.passed
    assert "LlamaForCausalLM.model.layers.1.mlp.up_proj" in found.culprits


def test_find_divergence_of_equal_models_finds_none_and_says_it_rests_on_summaries(settings: Settings) -> None:
    reference, _ = models()
    found = find_divergence(reference.eval(), reference, (x_input(),), session="same", data_dir=settings.data_dir)
    assert found.first is None and found.compared > 0
    assert repr(found).startswith("From summaries: no difference found")


class Gate(nn.Module):
    """A projection and a sigmoid gate; the port scales the gate by an op the reference does not run."""

    def __init__(self, extra: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj, self.out = nn.Linear(DIM, DIM), nn.Linear(DIM, DIM)
        self.extra = extra

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.proj(x))
        if self.extra:
            gate = gate.pow(1.1)  # the port's extra scale
        out: torch.Tensor = self.out(x * gate)
        return out


def this_files_line(marker: str) -> str:
    """`path:line` of the line of this file that ends with the comment `marker`."""
    lines = Path(__file__).read_text(encoding="utf-8").splitlines()
    found = [i + 1 for i, text in enumerate(lines) if text.rstrip().endswith(f"# {marker}")]
    assert len(found) == 1, marker
    return f"{Path(__file__)}:{found[0]}"


def test_an_op_only_the_candidate_runs_is_named_with_its_line_before_the_first_divergence(settings: Settings) -> None:
    """The extra op (`pow`, which the reference never calls) has no partner, so the first pair to fail is the next
    one (`x * gate`): the answer names the unpaired op just before it, with its line, and says the reference did not
    record it."""
    found = find_divergence(
        Gate(False).eval(), Gate(True).eval(), (x_input(),), session="extra", data_dir=settings.data_dir
    )
    first = found.first
    assert first is not None and first.reference == "Gate/mul#1_outputs", first.reference
    assert first.candidate_only_before == (("Gate/pow#1_outputs", this_files_line("the port's extra scale")),)
    assert first.reference_only_before == ()
    extra_line = this_files_line("the port's extra scale")
    said = (
        f"Just before it, the candidate recorded Gate/pow#1_outputs ({extra_line}), which paired with none of the "
        "reference's."
    )
    assert said in repr(found)
    # the other way round: the reference runs the op the candidate leaves out
    found = find_divergence(
        Gate(True).eval(), Gate(False).eval(), (x_input(),), session="less", data_dir=settings.data_dir
    )
    assert found.first is not None and found.first.candidate_only_before == ()
    assert found.first.reference_only_before == (("Gate/pow#1_outputs", this_files_line("the port's extra scale")),)


class Detour(Gate):
    """The port runs eight ops of its own on the gate (no partner in the reference) before a gate that is off."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.proj(x))
        gate = gate.pow(1.0).abs().relu().clamp(0, 1).sqrt().exp().log()
        out: torch.Tensor = self.out(x * (gate + 0.5))
        return out


def test_many_ops_one_side_ran_before_the_divergence_are_all_kept_and_the_nearest_named(settings: Settings) -> None:
    found = find_divergence(
        Gate(False).eval(), Detour(False).eval(), (x_input(),), session="detour", data_dir=settings.data_dir
    )
    first = found.first
    assert first is not None and first.reference == "Gate/mul#1_outputs", first.reference
    extra = [name.removeprefix("Detour/").partition("#")[0] for name, _ in first.candidate_only_before]
    assert extra == ["pow", "abs", "relu", "clamp", "sqrt", "exp", "log", "add"]
    said = repr(found)
    assert "the candidate recorded 3 more tensors and then Detour/clamp#1_outputs (" in said
    assert "Detour/add#1_outputs (" in said and "Detour/pow#1_outputs" not in said


class Tail(nn.Module):
    """A projection, then ops of the model's own forward after its last submodule; the port's softmax is over the
    wrong dimension."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(DIM, DIM)
        self.port = port

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h: torch.Tensor = self.proj(x)
        return h.softmax(dim=0 if self.port else -1) * 2.0  # the tail's softmax


def test_a_divergence_in_the_models_own_ops_after_its_last_submodule_is_measured_from_full_values(
    settings: Settings,
) -> None:
    """The second pass records the model's own ops ("*") and stops only after the last of them: a pass stopped
    after the last submodule's tensors had no full values of the failing op."""
    found = find_divergence(
        Tail(False).eval(), Tail(True).eval(), (x_input(),), session="tail", data_dir=settings.data_dir
    )
    first = found.first
    assert first is not None and first.reference == "Tail/softmax#1_outputs", first.reference
    assert first.reference_source == this_files_line("the tail's softmax")
    assert found.full_modules == ("*",)
    assert first.full is not None and not first.full.passed and first.full.mismatched > 0
    assert "From full values: max |diff|" in repr(found)


class Scale(nn.Module):
    """A mask and a scale: -inf where the input passes 1, on both sides."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.masked_fill(x > 1.0, float("-inf")) * 0.1


class Shift(nn.Module):
    def __init__(self, bug: bool) -> None:
        super().__init__()
        self.bug = bug

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        edges = x[:, :0] * 2.0  # an empty tensor among the module's ops
        y = x * 0.5
        return torch.cat([edges, y + 0.5 if self.bug else y], dim=1)  # the shift's bug


class InDtype(nn.Module):
    """A scale (rounding only, in bfloat16), then a shift whose port adds 0.5; the inputs are cast to the model's
    dtype."""

    def __init__(self, dtype: torch.dtype, bug: bool) -> None:
        super().__init__()
        self.dtype = dtype
        self.scale, self.shift = Scale(), Shift(bug)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.shift(self.scale(x.to(self.dtype)))
        return out


def test_a_bfloat16_port_names_the_module_with_the_bug_not_the_one_that_only_rounds(settings: Settings) -> None:
    """The scale's bfloat16 outputs differ from float32's by rounding, within bfloat16's tolerance: the second pass
    judges each pair by the looser of its two dtypes' tolerances, as the summaries were, so only the shift (its input
    agreeing, its output not) is the culprit; equal infinities agree, and its empty tensor is compared too (nothing
    outside)."""
    found = find_divergence(
        InDtype(torch.float32, False).eval(),
        InDtype(torch.bfloat16, True).eval(),
        (x_input(),),
        session="bf16 port",
        data_dir=settings.data_dir,
    )
    first = found.first
    assert first is not None and first.module == "InDtype.shift", first
    assert first.reference_source == this_files_line("the shift's bug")
    assert first.full is not None and not first.full.passed
    assert found.culprits == ["InDtype.shift"]
    assert found.full_modules == ("shift*", "scale*")
    passed = {s.reference for s in found.failing_full}
    assert not any(name.startswith("InDtype.scale") for name in passed), passed


def test_the_first_change_within_tolerance_is_named_where_it_precedes_the_divergence(settings: Settings) -> None:
    found = find_divergence(
        Drift(0.0).eval(), Drift(1e-6).eval(), (x_input(),), session="drift", data_dir=settings.data_dir
    )
    first = found.first
    assert first is not None and first.reference == "Drift/mul#1_outputs", first.reference
    assert first.first_changed == ("Drift/add#1_outputs", line_of("drift begins"))
    # its summaries pass, which bound max |diff| from below: "within tolerance" stands on its full values alone
    assert first.first_changed_full is not None and first.first_changed_full.passed
    assert (
        "The first tensor whose values differ at all (content hashes) is Drift/add#1_outputs "
        f"({line_of('drift begins')}); its full values are within tolerance (max |diff| "
    ) in repr(found)
    # where the first change is the divergence itself, nothing more is said
    found = find_divergence(
        Drift(0.0).eval(), Drift(1.0).eval(), (x_input(),), session="jump", data_dir=settings.data_dir
    )
    assert found.first is not None and found.first.reference == "Drift/add#1_outputs"
    assert found.first.first_changed is None and "differ at all" not in repr(found)


class Dropping(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(DIM, DIM)
        self.dropout = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.dropout(self.linear(x))
        return out


def stored_anything(settings: Settings) -> dict[str, Any]:
    """What the data dir holds: how many rows of sessions, runs, tensors and notes, and the array store's files."""
    services = open_services(settings)
    try:
        with services.sessions() as db:
            rows = {
                table.__name__: len(db.scalars(select(table)).all())
                for table in (SessionRecord, RunRecord, TensorRecord, ProblemRecord)
            }
    finally:
        services.close()
    arrays = settings.data_dir / "arrays"
    files = sorted(str(f.relative_to(arrays)) for f in arrays.rglob("*") if f.is_file()) if arrays.exists() else []
    return {**rows, "arrays": files}


def test_a_model_that_changes_between_calls_is_refused_and_training_mode_warned(settings: Settings) -> None:
    torch.manual_seed(0)
    model = Dropping()  # training mode: dropout differs from call to call
    empty = stored_anything(settings)
    with (
        pytest.warns(UserWarning, match="training mode"),
        pytest.raises(ChangingModelError, match="dropout") as refused,
    ):
        find_divergence(model, model, (x_input(),), session="drop", data_dir=settings.data_dir)
    said = str(refused.value)
    assert said.startswith("the reference called twice on the same inputs gave different values, first at ")
    assert "first at Dropping.dropout/dropout#1_outputs " in said
    assert stored_anything(settings) == empty  # refused before anything was stored


class Jitter(nn.Module):
    """Three projections; `noise` adds fresh random values (torch.rand in the forward) to the first's output, so
    small that the first pass's comparison passes there; `late` adds them to the model's output."""

    def __init__(self, noise: float = 0.0, late: bool = False, planted: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first, self.second, self.third = (nn.Linear(DIM, DIM) for _ in range(3))
        self.noise, self.late = noise, late
        if planted:
            with torch.no_grad():
                self.second.weight.mul_(1.01)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.first(x)
        if self.noise:
            h = h + self.noise * torch.rand(h.shape)
        out: torch.Tensor = self.third(torch.relu(self.second(h)))
        if self.late:
            out = out + torch.rand(out.shape)
        return out


@pytest.mark.parametrize("noisy", ["reference", "candidate"])
def test_a_model_whose_values_change_before_the_divergence_is_refused_naming_it_and_nothing_is_stored(
    settings: Settings, noisy: str
) -> None:
    """The noise is within tolerance where it is added: the first pass finds the planted change after it. Called
    again, the noisy model's (the reference's, or the candidate's alone) random tensor differs from its first call's,
    before the divergence: refused, naming that model and that tensor, and nothing is stored."""
    reference = Jitter(noise=1e-9 if noisy == "reference" else 0.0).eval()
    candidate = Jitter(noise=1e-9 if noisy == "candidate" else 0.0, planted=True).eval()
    empty = stored_anything(settings)
    with pytest.raises(ChangingModelError) as refused:
        find_divergence(reference, candidate, (x_input(),), session="noise", data_dir=settings.data_dir)
    said = str(refused.value)
    assert said.startswith(f"the {noisy} called twice on the same inputs gave different values"), said
    assert "first at Jitter/rand#1_outputs " in said, said
    assert stored_anything(settings) == empty
    assert {k: v for k, v in empty.items() if k != "arrays"} == dict.fromkeys(
        ("SessionRecord", "RunRecord", "TensorRecord", "ProblemRecord"), 0
    )


def test_dropout_in_the_candidate_alone_is_refused_naming_the_candidate(settings: Settings) -> None:
    torch.manual_seed(0)
    reference = Dropping().eval()
    candidate = Dropping()
    candidate.load_state_dict(reference.state_dict())  # the same weights, in training mode
    empty = stored_anything(settings)
    with (
        pytest.warns(UserWarning, match="the candidate model is in training mode"),
        pytest.raises(ChangingModelError) as refused,
    ):
        find_divergence(reference, candidate, (x_input(),), session="drop", data_dir=settings.data_dir)
    said = str(refused.value)
    assert said.startswith("the candidate called twice on the same inputs gave different values, first at "), said
    assert "Dropping.dropout/dropout#1_outputs" in said
    assert stored_anything(settings) == empty


def test_values_that_change_only_after_the_last_tensor_asked_for_do_not_change_the_answer(settings: Settings) -> None:
    """Random values added to the model's output, after everything the answer rests on: the answer is given, and
    says up to which tensor each model gave the same values when called again."""
    reference, candidate = Jitter(late=True).eval(), Jitter(late=True, planted=True).eval()
    found = find_divergence(reference, candidate, (x_input(),), session="late", data_dir=settings.data_dir)
    assert found.first is not None and found.first.reference == "Jitter.second/linear#1_outputs"
    assert found.repeatable_until == ("Jitter.second_outputs", "Jitter.second_outputs")
    assert (
        "Called again, each model gave the same values up to Jitter.second_outputs (reference) and "
        "Jitter.second_outputs (candidate)" in repr(found)
    )
    # the same models called twice give different outputs: the noise is real, and left unchecked after that point
    with torch.no_grad():
        assert not torch.equal(reference(x_input()), reference(x_input()))


def test_full_values_are_compared_as_torch_testing_compares_them() -> None:
    """The second pass's element-wise statistics: an infinity against the same one agrees; a NaN is a mismatch (NaN
    against NaN too, as the session's comparison and torch.testing hold) and the largest difference; two equal
    tensors differ nowhere; mixed dtypes are compared wide."""
    tol = Tolerance(0.0, 0.5)
    a = torch.tensor([[1.0, float("nan"), float("inf")], [4.0, 5.0, 6.0]])
    same = _full_stats(a, a.clone(), ("a", "b"), tol)
    assert (same.max_abs_diff, same.argmax, same.mismatched, same.numel, same.passed) == (math.inf, (0, 1), 1, 6, False)
    a[0, 1] = 2.0
    same = _full_stats(a, a.clone(), ("a", "b"), tol)
    assert (same.max_abs_diff, same.argmax, same.mismatched, same.numel, same.passed) == (0.0, (0, 0), 0, 6, True)
    b = a.clone()
    b[1, 0], b[1, 2] = 4.25, 7.0  # one within tolerance, one outside
    changed = _full_stats(a, b, ("a", "b"), tol)
    assert (changed.max_abs_diff, changed.argmax, changed.mismatched, changed.passed) == (1.0, (1, 2), 1, False)
    b[0, 0] = float("nan")
    with_nan = _full_stats(a, b, ("a", "b"), tol)
    assert (with_nan.max_abs_diff, with_nan.argmax, with_nan.mismatched) == (math.inf, (0, 0), 2)
    b = a.clone()
    b[0, 2] = float("-inf")
    assert _full_stats(a, b, ("a", "b"), tol).argmax == (0, 2)
    wide = _full_stats(a.to(torch.float64), a.to(torch.bfloat16), ("a", "b"), tol)
    assert wide.passed and wide.max_abs_diff == 0.0  # these values are exact in bfloat16
    third = torch.tensor([1.0, 1.0, 1.0]) / 3
    narrow = _full_stats(third.to(torch.float64), third.to(torch.bfloat16), ("a", "b"), Tolerance(0.0, 0.0))
    assert narrow.mismatched == 3 and narrow.max_abs_diff == abs(float(third[0].to(torch.bfloat16)) - float(third[0]))
    empty = _full_stats(torch.empty(0, 2), torch.empty(0, 2), ("a", "b"), tol)
    assert (empty.numel, empty.argmax, empty.passed) == (0, (), True)


INF, NAN = math.inf, math.nan


@pytest.mark.parametrize(
    ("reference", "candidate", "rtol", "atol"),
    [
        ([INF, 1.0], [5.0, 1.0], 1.3e-6, 1e-5),  # an infinity against a number
        ([5.0, 1.0], [INF, 1.0], 1.3e-6, 1e-5),
        ([INF, 1.0], [-INF, 1.0], 1.3e-6, 1e-5),  # against the other infinity
        ([INF, 1.0], [-INF, 1.0], 0.0, 0.0),  # rtol 0: the bound at an infinity is NaN
        ([INF, 1.0], [5.0, 1.0], 0.0, 1e-5),
        ([-INF, 1.0], [-INF, 1.0], 0.0, 0.0),  # the same infinity agrees
        ([INF, -INF], [INF, -INF], 1.3e-6, 1e-5),
        ([NAN, 1.0], [NAN, 1.0], 1.3e-6, 1e-5),  # NaN against NaN is a mismatch (equal_nan=False)
        ([NAN, 1.0], [5.0, 1.0], 1.3e-6, 1e-5),  # NaN against a number does not
        ([5.0, 1.0], [NAN, 1.0], 0.0, 0.0),
        ([NAN, INF], [INF, NAN], 1.3e-6, 1e-5),
        ([1e30, 1.0], [2e30, 1.0], 1.0, 0.0),  # large, within rtol 1
        ([1.0, 2.0], [1.0, 2.5], 0.0, 0.1),
    ],
)
def test_full_values_pass_where_torch_testing_passes_infinities_and_nans_included(
    reference: list[float], candidate: list[float], rtol: float, atol: float
) -> None:
    """An infinity against a number or against the other infinity is outside any tolerance (its bound, inf or with
    rtol 0 NaN, let it pass before); a NaN fails, NaN against NaN too, as torch.testing.assert_close's default."""
    a, b = torch.tensor(reference, dtype=torch.float64), torch.tensor(candidate, dtype=torch.float64)
    try:
        torch.testing.assert_close(b, a, rtol=rtol, atol=atol)
        expected = True
    except AssertionError:
        expected = False
    stats = _full_stats(a, b, ("a", "b"), Tolerance(rtol, atol))
    assert stats.passed == expected, stats
    assert (stats.mismatched == 0) == expected, stats


class Counted(nn.Module):
    """Counts its calls: the last layer of `Late`."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x * 2


class Late(Jitter):
    """`Jitter`, then a layer that counts its calls and, from its second call on, gives other values."""

    def __init__(self, planted: bool = False) -> None:
        super().__init__(planted=planted)
        self.last = Counted()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.last(super().forward(x))
        return out + self.last.calls


def test_the_second_passes_stop_the_forward_after_the_last_tensor_wanted_and_leave_no_hook(settings: Settings) -> None:
    """Each model's second call ends where the last tensor the answer needs is recorded and hashed: the layers
    after it are not run again (a layer there that changes between calls is neither run nor checked), and the model
    is left as it was, with no hook and no torch function mode, its next call whole."""
    reference, candidate = Late().eval(), Late(planted=True).eval()
    hooks = {n: (dict(m._forward_hooks), dict(m._forward_pre_hooks)) for n, m in reference.named_modules()}
    found = find_divergence(reference, candidate, (x_input(),), session="late", data_dir=settings.data_dir)
    assert found.first is not None and found.first.reference == "Late.second/linear#1_outputs"
    assert found.repeatable_until == ("Late.second_outputs", "Late.second_outputs")
    assert (reference.last.calls, candidate.last.calls) == (1, 1)  # the first passes only
    assert {n: (dict(m._forward_hooks), dict(m._forward_pre_hooks)) for n, m in reference.named_modules()} == hooks
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in candidate.modules())
    gc.collect()  # a torch function mode left active would be held by torch's mode stack
    # by type, not isinstance: that reads `__class__` of every object, deprecated proxies of torch's among them
    assert not [o for o in gc.get_objects() if OpMode in type(o).__mro__]
    with torch.no_grad():
        out = reference(x_input())
    assert reference.last.calls == 2 and out.shape == (2, 5, DIM)


def test_a_compiled_models_second_passes_stop_too(settings: Settings) -> None:
    """torch.compile runs the hooks between its graphs: the exception that stops the forward passes through them."""
    plain = Late().eval(), Late(planted=True).eval()
    reference, candidate = (torch.compile(m, backend="eager") for m in plain)
    assert isinstance(reference, nn.Module) and isinstance(candidate, nn.Module)
    found = find_divergence(reference, candidate, (x_input(),), session="late", data_dir=settings.data_dir)
    assert found.first is not None and found.first.reference == "Late.second_outputs"  # a compiled op is not seen
    assert (plain[0].last.calls, plain[1].last.calls) == (1, 1)
    with torch.no_grad():
        assert reference(x_input()).shape == (2, 5, DIM)


def test_find_divergences_summary_runs_are_those_a_summary_capture_stores(settings: Settings) -> None:
    reference, candidate = models()
    reference.eval(), candidate.eval()
    found = find_divergence(reference, candidate, (x_input(),), session="found", data_dir=settings.data_dir)  # asks
    assert found.first is not None and found.repeatable_until is not None
    for model, run in ((reference, "reference"), (candidate, "candidate")):
        with (
            torch.no_grad(),
            capture(model, "captured", run, data_dir=settings.data_dir, level="op", values="summary"),
        ):
            model(x_input())  # calls the model
    # the model's own inputs' source, the line that passed them: find_divergence's caller's, the capture's
    callers = {"found": this_files_line("asks"), "captured": this_files_line("calls the model")}
    services = open_services(settings)
    try:
        with services.sessions() as db:

            def contents(session: str, run: str) -> dict[str, Any]:
                record = db.scalars(
                    select(RunRecord).join(SessionRecord).where(SessionRecord.name == session, RunRecord.label == run)
                ).one()
                tensors = db.scalars(
                    select(TensorRecord).where(TensorRecord.run_id == record.id).order_by(TensorRecord.position)
                ).all()
                problems = db.scalars(select(ProblemRecord).where(ProblemRecord.run_id == record.id)).all()
                # a summary-only tensor's digest is a random "none:" token (it shares no cached result): not compared
                assert all(t.digest.startswith("none:") for t in tensors)
                columns = [c.key for c in TensorRecord.__table__.columns if c.key not in ("id", "run_id", "digest")]
                rows = [{c: getattr(t, c) for c in columns} for t in tensors]
                root = rows[0]["module_path"]  # the model's (Net, PortedNet): its inputs come first
                own = [r for r in rows if r["module_path"] == root and r["name"].startswith(f"{root}_inputs_")]
                assert own and all(r.pop("source") == callers[session] for r in own), own
                return {
                    "run": {
                        k: getattr(record, k)
                        for k in ("label", "role", "position", "status", "tensor_count", "total_bytes", "sources")
                    },
                    "tree": record.module_tree,
                    "tensors": rows,
                    "problems": [(p.file, p.reason, p.note) for p in problems],
                }

            for run in ("reference", "candidate"):
                ours, captured = contents("found", run), contents("captured", run)
                assert len(ours["tensors"]) > 50 and ours["tree"] is not None
                assert ours == captured, run
    finally:
        services.close()


def test_summary_capture_through_the_server_and_its_pages_say_from_summaries(shared_server: LiveServer) -> None:
    reference, candidate = models()
    x = x_input()
    for model, run in ((reference, "reference"), (candidate, "candidate"), (candidate, "candidate again")):
        with (
            torch.no_grad(),
            capture(model, "summaries over http", run, server=shared_server.url, level="op", values="summary") as r,
        ):
            model(x)
    assert r.session_id is not None
    with httpx.Client(base_url=shared_server.url, timeout=30) as client:
        report: dict[str, Any] = wait_until(
            lambda: client.get(f"/api/sessions/{r.session_id}/pairs").json(),
            until=lambda got: got["pairs"] and not got["progress"]["pending"],
            what="the captured session's pairs to be judged",
            timeout=120,
            interval=0.03,
        )
        first = report["first_divergence"]
        assert first["name"] == "Net.layers.1.self_attn/mul#1_outputs"
        assert first["basis"] == "summary" and first["summary_reason"].startswith("from summaries: ")
        assert first["reference_source"] == line_of("reference scores")
        pair = next(p for p in report["pairs"] if p["id"] == first["pair_id"])
        assert pair["summary"]["basis"] == "summary" and pair["summary"]["passed"] is False
        page = client.get(f"/pairs/{first['pair_id']}").text
        assert "<strong>From summaries:</strong>" in page and "a lower bound of the max |diff|" in page
        passing = next(p for p in report["pairs"] if p["name"] == "Net.layers.0.self_attn/softmax#1_outputs")
        assert "bit-identical (equal content hashes)" in client.get(f"/pairs/{passing['id']}").text
        session_page = client.get(f"/sessions/{r.session_id}").text
        assert 'class="summary-basis">from summaries: ' in session_page
        # two candidates side by side, every pair judged on summaries: no empty chart, but why there is none
        assert "Candidates side by side" in session_page and '<figure class="chart">' not in session_page
        assert "No chart of max |diff|: no pair here was compared element by element" in session_page


def test_an_unknown_values_mode_is_refused(settings: Settings) -> None:
    reference, _ = models()
    with (
        pytest.raises(ValueError, match="capture values must be one of full, summary, got 'bytes'"),
        capture(reference, "v", "r", data_dir=settings.data_dir, values="bytes"),
    ):
        reference(x_input())


class _OneElement(nn.Module):
    """A linear layer then ReLU; `bug`: one element of its output 0.01 larger (a change the summaries' tolerance
    lets pass, though the content hashes differ)."""

    def __init__(self, bug: bool) -> None:
        super().__init__()
        self.lin = nn.Linear(64, 64)
        self.bug = bug

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if self.bug:
            y = y.clone()
            y[0, 3, 7] += 0.01
        return torch.relu(y)


class _Layers(nn.Module):
    def __init__(self, bug: bool) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_OneElement(bug and n == 1) for n in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def _hashes_differ_session(capture_to: dict[str, Any]) -> int:
    """Two summary captures of _Layers, the candidate with its one-element change: the session's id."""
    torch.manual_seed(0)
    reference = _Layers(False).eval()
    candidate = _Layers(True).eval()
    candidate.load_state_dict(reference.state_dict())
    x = torch.randn(4, 64, 64)  # drawn after the models, as the auditor's script did: the changed element is > 0
    for model, run in ((reference, "reference"), (candidate, "candidate")):
        with torch.no_grad(), capture(model, "one element", run, level="op", values="summary", **capture_to) as r:
            model(x)
    session_id: int | None = r.session_id
    assert session_id is not None
    return session_id


def test_summaries_that_pass_with_hashes_that_differ_are_no_verified_pass(settings: Settings) -> None:
    """Every pair passed on summaries, nine of them with content hashes that differ: the session page was green,
    "no difference was found in their hashes", and no next capture was offered. The CLI's words, the JSON and the
    page say that values differ from the first such pair on, and offer the full values of its module."""
    session_id = _hashes_differ_session({"data_dir": settings.data_dir})
    report = compared(settings, session_id, modules=True)
    assert report.first_divergence is None
    changed = report.hashes_changed
    assert changed is not None and changed.name == "_Layers.layers.1/relu#1_outputs", [
        (p.name, p.summary) for p in report.pairs
    ]
    typed = compare_report(session_id, "one element", "http://x/sessions/1", report, [])
    payload = to_json(typed)
    assert payload["verdict"] == "no_divergence" and payload["first_changed"] == changed.name
    assert payload["next_capture"] is not None and 'values="full"' in payload["next_capture"]["python"]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        print_table(typed)
    out = printed.getvalue()
    assert f"values differ (content hashes) from {changed.name} on; the summaries found nothing outside" in out, out
    assert "next capture, full values of that module" in out, out
    # the verdict's hedge counts the passes whose hashes differ: not "no difference found" alone
    differ = sum(1 for p in report.pairs if p.summary is not None and p.summary.hashes_differ is True)
    assert f"though the content hashes of {differ} of them differ (their values differ)" in out, out


def test_the_pages_of_summaries_whose_hashes_differ_say_so(shared_server: LiveServer) -> None:
    session_id = _hashes_differ_session({"server": shared_server.url})
    with httpx.Client(base_url=shared_server.url, timeout=30) as client:
        report: dict[str, Any] = wait_until(
            lambda: client.get(f"/api/sessions/{session_id}/pairs").json(),
            until=lambda got: got["pairs"] and not got["progress"]["pending"],
            what="the captured session's pairs to be judged",
            timeout=120,
            interval=0.03,
        )
        differing = [p for p in report["pairs"] if p["summary"] and p["summary"].get("hashes_differ")]
        assert differing and all(p["status"] == "pass" for p in differing)
        page = client.get(f"/sessions/{session_id}").text
        assert 'class="banner pass"' not in page, page
        assert f'values differ (content hashes) from <a href="/pairs/{differing[0]["id"]}">' in page, page
        assert 'id="next-capture"' in page and "where values differ (content hashes)" in page
        pair_page = client.get(f"/pairs/{differing[0]['id']}").text
        assert "values differ (content hashes); the summaries found nothing outside tolerance" in pair_page
        assert "its content hash," not in pair_page
        listed = client.get("/", params={"q": "one element"}).text
        row = listed.split(f'href="/sessions/{session_id}"')[1].split("</tr>")[0]
        assert f"values differ ({len(differing)})" in row and 'badge pass">none' not in row, row
