"""`find_divergence`'s answers on models of kinds its other tests do not build (bench/RESULTS.md, "answers on unseen
models, round 3"): each test holds one answer that was wrong or claimed too much before its fix."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 (the name models use)
from sqlalchemy import select
from tensor_debugger import capture, find_divergence
from tensor_debugger.services import open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store.models import RunRecord, SessionRecord
from torch import nn

from tests.support.grouped_attention import DIM, EagerAttention, GroupedAttention, Masks
from tests.support.grouped_attention import line_of as attention_line
from tests.support.sessions import compared

HERE = Path(__file__)


def line_of(marker: str) -> str:
    """`path:line` of the line of this file that ends with the comment `marker`."""
    lines = HERE.read_text(encoding="utf-8").splitlines()
    found = [i + 1 for i, text in enumerate(lines) if text.rstrip().endswith(f"# {marker}")]
    assert len(found) == 1, marker
    return f"{HERE}:{found[0]}"


def test_ops_whose_call_indices_fall_out_of_step_are_not_the_divergence_the_first_that_differs_is(
    settings: Settings,
) -> None:
    """The reference's repeat_kv reshapes (reshape#1, #2), the port's repeats: the port's first reshape is the
    output's, so reshape#1 names two different ops, of different shapes. That pair was the answer ("shapes
    differ"); the answer is the keys' transpose at the scores' line, the port's repeat named just before it."""
    x = torch.randn(2, 5, DIM, generator=torch.Generator().manual_seed(1))
    found = find_divergence(
        GroupedAttention(False).eval(), GroupedAttention(True).eval(), (x,), session="gqa", data_dir=settings.data_dir
    )
    first = found.first
    assert first is not None
    assert first.reference == "GroupedAttention/transpose#4_outputs", first.reference
    assert (first.reference_source, first.candidate_source) == (
        attention_line("reference scores"),
        attention_line("port scores"),
    )
    assert first.summary.shapes_equal and "shapes differ" not in first.summary.reason
    assert first.full is not None and not first.full.passed
    assert ("GroupedAttention/repeat#1_outputs", attention_line("port repeat_kv")) in first.candidate_only_before
    # the reference's reshapes, out of step with the port's, are its own ops there, not a pair
    assert "GroupedAttention/reshape#1_outputs" in dict(first.reference_only_before)
    assert f"GroupedAttention/repeat#1_outputs ({attention_line('port repeat_kv')})" in repr(found)


class Norm(nn.Module):
    """A projection, a layer norm (by F.layer_norm, or written out by hand: the same maths, other roundings), a
    projection."""

    def __init__(self, by_hand: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj, self.norm, self.out = nn.Linear(DIM, DIM), nn.LayerNorm(DIM), nn.Linear(DIM, DIM)
        self.by_hand = by_hand

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        if self.by_hand:
            mean = h.mean(-1, keepdim=True)
            var = ((h - mean) ** 2).mean(-1, keepdim=True)
            h = (h - mean) / torch.sqrt(var + self.norm.eps) * self.norm.weight + self.norm.bias
        else:
            h = F.layer_norm(h, (DIM,), self.norm.weight, self.norm.bias, self.norm.eps)
        out: torch.Tensor = self.out(h)  # the norm's out called
        return out


def test_precision_drift_alone_is_no_divergence_and_the_answer_says_what_differs_and_what_was_not_compared(
    settings: Settings,
) -> None:
    """A layer norm written by hand against F.layer_norm: no divergence, no culprit; but the values do differ (within
    tolerance), and the hand-written norm's ten ops and F.layer_norm pair with nothing: "no difference found" said
    neither."""
    x = torch.randn(4, 9, DIM, generator=torch.Generator().manual_seed(1)) * 3
    found = find_divergence(Norm(False).eval(), Norm(True).eval(), (x,), session="norm", data_dir=settings.data_dir)
    assert found.first is None and found.culprits == []
    assert found.changed is not None and found.changed[0] == "Norm.out_inputs_args_0"
    assert found.unpaired == (1, 10)
    text = repr(found)
    out_called = line_of("the norm's out called")  # a module's input: the line that called the module with it
    # the summaries pass, but they bound max |diff| from below: "within tolerance" stands on the full values of the
    # pairs a second pass compared, from the first whose hashes differ
    assert found.changed_full is not None and found.changed_full.passed
    assert found.full_compared > 0 and found.full_modules == ("*",)
    assert text.startswith(
        "From summaries and full values: no divergence found, though values differ (content hashes) from "
        f"Norm.out_inputs_args_0 ({out_called}) on: none of the {found.compared} pairs of summaries is outside "
        f"tolerance, and the {found.full_compared} pairs "
        "whose full values were compared element by element (those of the whole model) are all within it"
    )
    assert "1 tensor of the reference and 10 of the candidate paired with none of the other's and were not" in text
    assert "no difference found" not in text


def test_a_compiled_candidate_pairs_by_its_models_names_and_the_answer_says_its_ops_were_not_seen(
    settings: Settings,
) -> None:
    """`torch.compile(model)` is an OptimizedModule: its tensors, named by the model it wraps, paired with none of
    the reference's, and a bias bug was answered "no difference found in 0 pairs"."""
    reference, port = Norm(False).eval(), Norm(False).eval()
    with torch.no_grad():
        port.out.bias.add_(0.1)
    compiled = cast(nn.Module, torch.compile(port, backend="eager"))
    x = torch.randn(4, 9, DIM, generator=torch.Generator().manual_seed(1))
    found = find_divergence(reference, compiled, (x,), session="compiled", data_dir=settings.data_dir)
    assert found.first is not None and found.first.reference == "Norm.out_outputs", found.first.reference
    assert found.culprits == ["Norm.out"]
    assert found.notes == (
        "the candidate: Norm ran compiled (torch.compile): its ops are not visible to op capture (its modules' "
        "inputs and outputs are recorded; capture the model uncompiled to see its ops)",
    )
    assert "What the captures could not see: the candidate: Norm ran compiled" in repr(found)


class Keyword(nn.Module):
    """A model called with keyword arguments only, an int mask among them."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        self.attn = GroupedAttention(port)

    def forward(self, *, hidden: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.attn(hidden) * keep[..., None]
        return out


def test_the_next_capture_runs_as_printed_for_one_tensor_and_for_keyword_inputs_into_the_same_session(
    settings: Settings,
) -> None:
    """The snippet called `reference(*inputs)` whatever the inputs were (a dict's keys as arguments, one tensor
    split along its first dimension), stored its runs under the labels find_divergence had just used (a
    ConflictError), and into the default data dir, not the session's."""
    x = torch.randn(2, 5, DIM, generator=torch.Generator().manual_seed(1))
    keep = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    for session, reference, candidate, inputs in (
        ("one tensor", GroupedAttention(False).eval(), GroupedAttention(True).eval(), x),
        ("keywords", Keyword(False).eval(), Keyword(True).eval(), {"hidden": x, "keep": keep}),
    ):
        found = find_divergence(reference, candidate, inputs, session=session, data_dir=settings.data_dir)
        assert found.next_capture is not None
        exec(found.next_capture, {"reference": reference, "candidate": candidate, "inputs": inputs})
        services = open_services(settings)
        try:
            with services.sessions() as db:
                labels = db.scalars(
                    select(RunRecord.label).join(SessionRecord).where(SessionRecord.name == session)
                ).all()
        finally:
            services.close()
        assert sorted(labels) == sorted([*found.runs, "reference (full, 2)", "candidate (full, 2)"])


@pytest.mark.parametrize("values", ["summary", "full"])
def test_the_sessions_first_divergence_passes_over_ops_out_of_step_too(settings: Settings, values: str) -> None:
    """The same two attentions captured by hand: the session's first divergence (CLI, JSON, pages) was the reshapes
    out of step, "shapes differ"; it is the keys' transpose, with both lines, the port's repeats named before it
    (counted from the last pair in step: the out-of-step pair's port op comes after it), and from full values
    `where` is the two query heads whose keys are wrong (1 and 2)."""
    x = torch.randn(2, 5, DIM, generator=torch.Generator().manual_seed(1))
    for model, run in ((GroupedAttention(False).eval(), "reference"), (GroupedAttention(True).eval(), "candidate")):
        with torch.no_grad(), capture(model, "by hand", run, data_dir=settings.data_dir, level="op", values=values):
            model(x)
    report = compared(settings, 1, modules=True)
    first = report.first_divergence
    assert first is not None and first.name == "GroupedAttention/transpose#4_outputs", first
    assert (first.reference_source, first.candidate_source) == (
        attention_line("reference scores"),
        attention_line("port scores"),
    )
    repeats = [f"GroupedAttention/repeat#{i}_outputs ({attention_line('port repeat_kv')})" for i in (1, 2)]
    assert first.candidate_only_before == repeats
    if values == "summary":
        assert first.summary_reason is not None and "shapes differ" not in first.summary_reason
    else:
        assert first.where is not None and [(w.dim, w.ranges) for w in first.where] == [(1, [[1, 2]])]


class Pick(nn.Module):
    """Rows picked by an index tensor, and a count of a bool mask's kept entries, returned as a tuple; the port
    counts one less."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(DIM, DIM)
        self.port = port

    def forward(self, *, x: torch.Tensor, rows: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, ...]:
        picked = self.proj(x)[rows]
        count = keep.sum(-1)
        if self.port:
            count = count - 1  # port count
        return picked, count, keep


def test_the_op_that_made_a_tuples_wrong_output_is_named_past_the_outputs_returned_with_it(settings: Settings) -> None:
    """The second output (an int64 count) diverges; the first output, paired and equal, was recorded as the call
    returned, between the port's extra op and it: the answer named no op before it."""
    inputs = {
        "x": torch.randn(4, DIM, generator=torch.Generator().manual_seed(1)),
        "rows": torch.tensor([2, 0, 3]),
        "keep": torch.tensor([[True, False, True], [False, False, True]]),
    }
    found = find_divergence(Pick(False).eval(), Pick(True).eval(), inputs, session="pick", data_dir=settings.data_dir)
    first = found.first
    assert first is not None and first.reference == "Pick_outputs_1", first.reference
    assert "outside rtol 0, atol 0" in first.summary.reason  # an integer tensor is held to equality
    assert first.candidate_only_before == (("Pick/sub#1_outputs", line_of("port count")),)
    assert f"the candidate recorded Pick/sub#1_outputs ({line_of('port count')})" in repr(found)


def test_a_modules_input_that_differs_first_is_laid_to_the_module_that_computed_it(settings: Settings) -> None:
    """By module, the first divergence of the GQA port is o_proj's input, made by the attention's own code (its
    repeat_kv): the answer said "in module ….o_proj", looked there again in full, and named no culprit."""
    x = torch.randn(2, 5, DIM, generator=torch.Generator().manual_seed(1))
    inputs = {"hidden": x, "keep": torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])}
    found = find_divergence(
        Keyword(False).eval(),
        Keyword(True).eval(),
        inputs,
        session="by module",
        data_dir=settings.data_dir,
        level="module",
    )
    first = found.first
    assert first is not None and first.reference == "Keyword.attn.o_proj_inputs_args_0", first.reference
    assert first.module == "Keyword.attn" and first.op is None
    assert found.full_modules[0] == "attn*"
    assert found.culprits == ["Keyword.attn"]
    assert "in module Keyword.attn:" in repr(found)


def test_a_model_that_raises_on_the_inputs_is_named_in_the_error(settings: Settings) -> None:
    """A port whose o_proj expects another width raised torch's "mat1 and mat2 shapes cannot be multiplied", which
    named neither model nor call."""
    candidate = GroupedAttention(True).eval()
    candidate.o_proj = nn.Linear(DIM + 1, DIM, bias=False)
    x = torch.randn(2, 5, DIM, generator=torch.Generator().manual_seed(1))
    with pytest.raises(RuntimeError, match="mat1 and mat2") as raised:
        find_divergence(GroupedAttention(False).eval(), candidate, x, session="raises", data_dir=settings.data_dir)
    notes = raised.value.__notes__
    assert notes[0] == "find_divergence: raised by the candidate model, called as model(inputs)", notes
    # the port's tiled heads, recorded before it raised, are said too (tests/live/test_unseen_answers_6.py)
    assert notes[1].startswith(
        "find_divergence: before the candidate raised, the first divergence among the 23 pairs of summaries compared "
        "was GroupedAttention/transpose#4_outputs ("
    ), notes
    assert f"{attention_line('port scores')} in the candidate)" in notes[1], notes


def test_a_mask_passed_as_bools_against_additive_floats_is_not_a_divergence_and_a_wrong_one_is_the_models(
    settings: Settings,
) -> None:
    """Eager attention's additive float mask against SDPA's bool mask, the same attention: the block's mask input
    was the first divergence (81 of 81 elements outside rtol 0), as are the mask builders' ops out of step. A wrong
    mask of the same kind is one, laid to the model that built it, not to its ModuleList (which no one calls)."""
    x = torch.randn(2, 5, DIM, generator=torch.Generator().manual_seed(1))
    keep = torch.tensor([[True, True, True, False, False], [True, True, True, True, True]])
    found = find_divergence(
        Masks(False).eval(), Masks(True).eval(), (x, keep), session="kinds", data_dir=settings.data_dir
    )
    assert found.first is None, repr(found)
    assert found.culprits == []
    found = find_divergence(
        Masks(False).eval(), Masks(False, off=True).eval(), (x, keep), session="off", data_dir=settings.data_dir
    )
    first = found.first
    assert first is not None
    assert first.module == "Masks", first
    assert ("Masks/roll#1_outputs", attention_line("port mask")) in first.candidate_only_before


def test_a_module_whose_input_was_not_compared_is_named_no_culprit(settings: Settings) -> None:
    """A float mask against a bool mask that is also wrong (shifted by one key): the block's mask input pairs with
    nothing (dtype kinds differ), so it was never compared; the block's outputs fail, but its inputs are not known to
    agree: no culprit is named on it, and the answer says which input was not compared."""
    x = torch.randn(2, 5, DIM, generator=torch.Generator().manual_seed(1))
    keep = torch.tensor([[True, True, True, False, False], [True, True, True, True, True]])
    found = find_divergence(
        Masks(False).eval(), Masks(True, off=True).eval(), (x, keep), session="both", data_dir=settings.data_dir
    )
    assert found.first is not None and found.first.module == "Masks.layers.0", repr(found)
    assert found.culprits == [], repr(found)
    assert found.uncompared_inputs == (("Masks.layers.0", ("Masks.layers.0_inputs_args_1",)),)
    words = found.words()
    assert "Culprit" not in words
    assert "No culprit is named on Masks.layers.0: its outputs do not agree, but its input " in words
    assert "Masks.layers.0_inputs_args_1 was not compared" in words
    # the same block given the same kind of mask, shifted: its mask input is compared and fails, so again no culprit
    # there; the model that built the mask is where it began
    found = find_divergence(
        Masks(True).eval(), Masks(True, off=True).eval(), (x, keep), session="bools", data_dir=settings.data_dir
    )
    assert found.uncompared_inputs == () and "Masks.layers.0" not in found.culprits, repr(found)


class Early(nn.Module):
    """Two layers with a tanh between; `extra`: a scale by 1.0 after the first (an op the port does not run, the
    same values); `wrong`: the second layer's weights shifted."""

    def __init__(self, extra: bool, wrong: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.one, self.two = nn.Linear(DIM, DIM), nn.Linear(DIM, DIM)
        if wrong:
            with torch.no_grad():
                self.two.weight += 0.5
        self.extra = extra

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.one(x)
        if self.extra:
            h = h * 1.0  # the reference's extra scale
        out: torch.Tensor = self.two(torch.tanh(h))
        return out


def test_the_answer_names_the_references_tensors_before_the_divergence_that_were_not_compared(
    settings: Settings,
) -> None:
    """An op of the reference's that the candidate does not run, well before the divergence (a pair between them):
    it was not compared, and the answer says so, as the session's first divergence does (`unmatched_before`)."""
    x = torch.randn(3, DIM, generator=torch.Generator().manual_seed(2))
    found = find_divergence(
        Early(True, False).eval(), Early(False, True).eval(), x, session="early", data_dir=settings.data_dir
    )
    first = found.first
    assert first is not None and first.module == "Early.two", repr(found)
    assert first.reference_only_before == (), first  # a pair lies between: not "just before it"
    assert first.unmatched_before == ("Early/mul#1_outputs",), first
    extra = line_of("the reference's extra scale")
    assert (
        "1 tensor of the reference before it paired with none of the candidate's and was not compared (the first: "
        f"Early/mul#1_outputs ({extra})); the divergence may have begun there." in found.words()
    )


def test_an_op_one_side_calls_more_often_pairs_by_alignment_not_by_call_index(settings: Settings) -> None:
    """Eager attention against SDPA: the eager side calls reshape four times (its input, repeat_kv twice, the
    output), SDPA once (the output); reshape#1 was the eager input's against SDPA's output, of one shape, and the
    answer a divergence there. The ops pair by sequence alignment: the eager output's reshape#4 with SDPA's
    reshape#1, the rest of the eager side's its own. No divergence; a wrong scale in SDPA is found at the first op
    both run after it (the output's transpose), laid to the attention's own code."""
    x = torch.randn(2, 5, DIM, generator=torch.Generator().manual_seed(1))
    found = find_divergence(
        EagerAttention(False).eval(), EagerAttention(True).eval(), (x,), session="sdpa", data_dir=settings.data_dir
    )
    assert found.first is None and found.culprits == [], repr(found)
    found = find_divergence(
        EagerAttention(False).eval(), EagerAttention(True, 1.5).eval(), (x,), session="bug", data_dir=settings.data_dir
    )
    first = found.first
    assert first is not None and first.reference == "EagerAttention/transpose#5_outputs", first.reference
    assert first.candidate == "EagerAttention/transpose#4_outputs"
    # the eager side's own reshapes (its input's, repeat_kv's) are compared with nothing; its output's is, and fails
    failing = {s.reference for s in found.failing_full}
    assert first.module == "EagerAttention" and not failing & {f"EagerAttention/reshape#{n}_outputs" for n in (1, 2, 3)}
    assert "EagerAttention/reshape#4_outputs" in failing


@pytest.mark.parametrize("scale", [1.0, 1.5])
def test_the_sessions_first_divergence_pairs_an_unevenly_called_ops_calls_by_alignment_too(
    settings: Settings, scale: float
) -> None:
    """The eager and SDPA attentions captured by hand, summaries only: the session named reshape#1 (the eager
    input's against SDPA's output) as find_divergence did; now none, or with a wrong scale, the output's transpose,
    as find_divergence names it."""
    x = torch.randn(2, 5, DIM, generator=torch.Generator().manual_seed(1))
    for model, run in ((EagerAttention(False), "reference"), (EagerAttention(True, scale), "candidate")):
        with (
            torch.no_grad(),
            capture(model.eval(), "eager", run, data_dir=settings.data_dir, level="op", values="summary"),
        ):
            model(x)
    report = compared(settings, 1, modules=True)
    first = report.first_divergence
    if scale == 1.0:
        assert first is None, first
    else:
        assert first is not None and first.name == "EagerAttention/transpose#5_outputs", first
