"""Two implementations that differ inside a module, captured by hand at level="op": eager grouped attention (its input
reshaped first, repeat_kv by expand and reshape, matmul and softmax) against SDPA (one fused
scaled_dot_product_attention, no repeat). Their ops pair within each module call by sequence alignment on op, shape
and dtype's kind, the one alignment the pair page shows: an op one side alone calls is that side's alone, in place,
and the calls after it pair with their true counterparts and are compared, not left "out of step"
(engine/op_alignment.pair_ops). What the alignment cannot match is unpaired, so not compared, and said so. A pair
that is not one value computed two ways (a module's inputs of different kinds) is not compared, and counts in no
pass/fail figure of the progress."""

from __future__ import annotations

import pytest
import torch
from tensor_debugger import capture
from tensor_debugger.cli.compare_output import print_table
from tensor_debugger.compare.compute.early import pairable_by_name
from tensor_debugger.compare.planning.op_pairs import ALIGNED
from tensor_debugger.compare.planning.sides import tensors_of
from tensor_debugger.compare.reports.contract import compare_report
from tensor_debugger.compare.reports.op_lists import op_lists
from tensor_debugger.compare.reports.pair_reports import SessionPairs
from tensor_debugger.compare.reports.progress import pair_progress
from tensor_debugger.services import open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store.models import PairRecord

from tests.support.grouped_attention import DIM, EagerAttention, MaskedBlock, Masks
from tests.support.sessions import compared, rows_of
from tests.support.traces import MODEL_CLASS, input_ids, tiny_llama

ROOT = "EagerAttention"


def captured(settings: Settings, session: str, scale: float) -> SessionPairs:
    x = torch.randn(2, 5, DIM, generator=torch.Generator().manual_seed(1))
    for model, run in ((EagerAttention(False), "reference"), (EagerAttention(True, scale), "candidate")):
        with (
            torch.no_grad(),
            capture(model.eval(), session, run, data_dir=settings.data_dir, level="op", values="summary") as done,
        ):
            model(x)
    assert done.session_id is not None
    report = compared(settings, done.session_id, modules=True)
    return report


def by_name(report: SessionPairs) -> dict[str, tuple[str, str, str]]:
    return {p.name: (p.b.name, str(p.strategy), str(p.status)) for p in report.pairs}


def test_ops_an_implementation_calls_more_often_are_its_own_and_the_calls_after_them_pair_and_are_compared(
    settings: Settings,
) -> None:
    """Before, the eager side's reshape#1 (its input's) paired with SDPA's reshape#1 (the output's) by call index,
    and every reshape and transpose call was "out of step", not compared: the session incomplete for them. Now the
    eager output's reshape#4 pairs with SDPA's reshape#1, its transpose#5 with SDPA's transpose#4, and both are
    compared (they pass); the eager side's repeat_kv reshapes, matmuls and softmax, and SDPA's fused op, are their
    side's alone. The session is still incomplete: those reference ops were never compared."""
    report = captured(settings, "eager", 1.0)
    pairs = by_name(report)
    assert pairs[f"{ROOT}/reshape#4_outputs"] == (f"{ROOT}/reshape#1_outputs", ALIGNED, "pass")
    assert pairs[f"{ROOT}/transpose#5_outputs"] == (f"{ROOT}/transpose#4_outputs", ALIGNED, "pass")
    for n in (1, 2, 3):
        assert pairs[f"{ROOT}/transpose#{n}_outputs"] == (f"{ROOT}/transpose#{n}_outputs", ALIGNED, "pass")
    assert not [p.name for p in report.pairs if p.status == "fail"]
    assert report.coverage.out_of_step == []
    assert report.first_divergence is None
    alone = [u.name for u in report.unmatched]
    for name in ("reshape#1", "reshape#2", "reshape#3", "transpose#4", "matmul#1", "softmax#1", "matmul#2"):
        assert f"{ROOT}/{name}_outputs" in report.coverage.unmatched, name
        assert f"{ROOT}/{name}_outputs" not in pairs, name
    assert f"{ROOT}/scaled_dot_product_attention#1_outputs" in alone
    assert str(report.verdict) == "incomplete"  # the reference's own ops were not compared: no claim over them
    # the pair page of the attention's ops: the same alignment, each side's own ops in place
    reshape = next(p for p in report.pairs if p.name == f"{ROOT}/reshape#4_outputs")
    services = open_services(settings)
    try:
        with services.sessions() as db:
            record = db.get_one(PairRecord, reshape.id)
            lists = op_lists(db, record, *tensors_of(db, record))
    finally:
        services.close()
    assert lists is not None and lists.current is not None
    rows = [(r.a.name if r.a else None, r.b.name if r.b else None, r.pair_id is not None) for r in lists.rows]
    assert rows[0] == ("reshape#1", None, False)  # the eager side alone reshapes its input, first
    tail = rows[rows.index(("transpose#3", "transpose#3", True)) :]
    assert tail == [
        ("transpose#3", "transpose#3", True),
        *(
            (name, None, False)
            for name in ("getitem#1", "expand#1", "reshape#2", "getitem#2", "expand#2", "reshape#3", "transpose#4")
        ),
        *((name, None, False) for name in ("matmul#1", "mul#1", "softmax#1", "matmul#2")),
        (None, "scaled_dot_product_attention#1", False),
        ("transpose#5", "transpose#4", True),
        ("reshape#4", "reshape#1", True),
        ("attn.o_proj/linear#1", "attn.o_proj/linear#1", True),
    ], tail
    current = lists.rows[lists.current].a
    assert current is not None and current.name == "reshape#4"


def test_a_wrong_scale_in_the_fused_op_is_found_at_the_first_op_after_it_that_both_sides_run(
    settings: Settings,
) -> None:
    """SDPA with a wrong scale: the first divergence is the attention output's transpose (eager transpose#5
    against SDPA's transpose#4), with SDPA's fused op named just before it as the candidate's alone, and the eager
    side's own ops before it named as never compared."""
    report = captured(settings, "scale", 1.5)
    first = report.first_divergence
    assert first is not None and first.name == f"{ROOT}/transpose#5_outputs", first
    pair = next(p for p in report.pairs if p.id == first.pair_id)
    assert pair.b.name == f"{ROOT}/transpose#4_outputs"
    assert [n.partition(" (")[0] for n in first.candidate_only_before] == [
        f"{ROOT}/scaled_dot_product_attention#1_outputs"
    ]
    assert f"{ROOT}/softmax#1_outputs" in first.unmatched_before
    assert report.coverage.out_of_step == [] and str(report.verdict) == "diverged"


@pytest.mark.parametrize("off", [False, True])
def test_pairs_not_one_value_computed_two_ways_count_in_no_pass_or_fail_figure(
    settings: Settings, off: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """A block given an additive float mask against one given bools: its mask input pairs by name but is not one
    value computed two ways (out of step, not compared). The progress counts it as not compared, never as failing
    (`off`: the bool mask is also wrong, so the pair's values differ) nor as passing."""
    x = torch.randn(2, 5, DIM, generator=torch.Generator().manual_seed(1))
    keep = torch.tensor([[True, True, True, False, False], [True, True, True, True, True]])
    for model, run in ((Masks(False), "reference"), (Masks(True, off=off), "candidate")):
        with torch.no_grad(), capture(model.eval(), "masks", run, data_dir=settings.data_dir, level="op") as done:
            model(x, keep)
    assert done.session_id is not None
    report = compared(settings, done.session_id, modules=True)
    out_of_step = {o.name for o in report.coverage.out_of_step}
    assert "Masks.layers.0_inputs_args_1" in out_of_step
    progress = report.progress
    assert progress.not_compared == len(out_of_step) and progress.pending == 0
    assert progress.failing == sum(1 for p in report.pairs if p.status == "fail" and p.name not in out_of_step)
    # nor does the module ranking take the mask's "error" as the block's input error: a block given an input not
    # compared is not ranked at all (the error it adds is not known), nor named a culprit
    modules = report.modules
    assert modules is not None
    assert "Masks.layers.0" not in {c.module_path for c in [*modules.ranked, *modules.culprits]}, modules.ranked
    assert {c.module_path for c in modules.ranked}, modules  # the other modules are ranked
    # nor do the worst compared pairs list them (a float mask against bools: the largest "difference" of all)
    worst = report.worst_pairs
    assert worst.by_max_abs_diff and not {r.name for r in [*worst.by_max_abs_diff, *worst.by_cosine]} & out_of_step
    # the server's /progress counts them as the report does
    services = open_services(settings)
    try:
        with services.sessions() as db:
            assert pair_progress(db, done.session_id) == progress
    finally:
        services.close()
    # the CLI's words: the pairs that pass are those compared
    cli = compare_report(done.session_id, "masks", "http://127.0.0.1/", report, [])
    print_table(cli)
    text = capsys.readouterr().out
    if not off:
        passing = sum(1 for p in report.pairs if p.status == "pass" and p.name not in out_of_step)
        counted = len(report.pairs) - len(out_of_step)
        assert f"no divergence among the pairs compared: {passing} of {counted} pairs pass" in text, text


def test_a_tiny_llamas_eager_and_sdpa_attentions_pair_what_is_certain_and_claim_nothing_over_the_rest(
    settings: Settings,
) -> None:
    """transformers' Llama with eager attention against SDPA, the same weights: eager's repeat_kv reshapes keys and
    values to (1, 4, 8, 8), SDPA reshapes its output to that shape once, nothing around them alike. Pairing that
    reshape with either of eager's would compare two different values (a false divergence); it is left unpaired.
    Every pair passes, the ops both run after attention pair and are compared, and the session is incomplete, not
    diverged."""
    x = input_ids()
    for attention, run in (("eager", "reference"), ("sdpa", "candidate")):
        model = tiny_llama(attention).eval()
        with (
            torch.no_grad(),
            capture(model, "llama", run, data_dir=settings.data_dir, level="op", values="summary") as done,
        ):
            model(x)
    assert done.session_id is not None
    report = compared(settings, done.session_id, modules=True)
    attn = f"{MODEL_CLASS}.model.layers.0.self_attn"
    pairs = by_name(report)
    assert [p.name for p in report.pairs if p.status == "fail"] == []
    assert report.first_divergence is None and str(report.verdict) == "incomplete"
    reshape = f"{attn}/reshape#1_outputs"
    if reshape in pairs:
        # the lowest transformers pyproject.toml allows: its attention code runs other ops around that reshape, so
        # where the alignment pairs it, the match is unique: compared, and the same value
        assert pairs[reshape][1:] == (ALIGNED, "pass"), pairs[reshape]
    else:  # the newest: the reshape could face either of eager's: faces none
        assert reshape in report.coverage.unmatched
        assert pairs[f"{attn}/transpose#5_outputs"] == (f"{attn}/transpose#4_outputs", ALIGNED, "pass")
        assert pairs[f"{attn}/reshape#3_outputs"] == (f"{attn}/reshape#2_outputs", ALIGNED, "pass")
    aligned = [p for name, p in pairs.items() if name.startswith(attn + "/") and p[1] == ALIGNED]
    assert aligned and all(p[2] == "pass" for p in aligned), aligned
    # no op was paired by content or marked ambiguous: every pair by position passes, nothing to settle
    assert {p[1] for name, p in pairs.items() if "/" in name} == {ALIGNED}, pairs
    assert report.coverage.out_of_step == [] and report.progress.failing == 0


def test_the_early_same_name_guess_leaves_captured_ops_to_the_plans_alignment(settings: Settings) -> None:
    """While runs ingest, pairs are guessed by the same name and compared early; a captured op's same name is only
    its call index (eager's reshape#1, its input's, against SDPA's reshape#1, its output's): no op is guessed, the
    plan's alignment pairs them. Modules' inputs and outputs still are."""
    x = torch.randn(2, 5, DIM, generator=torch.Generator().manual_seed(1))
    model = EagerAttention(False).eval()
    with torch.no_grad(), capture(model, "early", "reference", data_dir=settings.data_dir, level="op") as done:
        model(x)
    assert done.run_id is not None
    rows = rows_of(settings, done.run_id)
    guessed = pairable_by_name(rows)
    assert f"{ROOT}/reshape#1_outputs" in {r.name for r in rows}
    assert not [name for name in guessed if "#" in name.rpartition("/")[2]]
    assert f"{ROOT}.attn.o_proj_outputs" in guessed


class MaskedFirst(torch.nn.Module):
    """A masked block (`MaskedBlock`) given the model's mask, additive floats or bools (`bool_mask`, the port's,
    also shifted by one key: a wrong mask), then three layers that add nothing."""

    def __init__(self, bool_mask: bool) -> None:
        super().__init__()
        self.block = MaskedBlock()
        self.layers = torch.nn.ModuleList([torch.nn.Identity() for _ in range(3)])
        self.bool_mask = bool_mask

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        mask = keep[:, None, :].roll(1, -1) if self.bool_mask else torch.zeros(keep[:, None, :].shape)
        if not self.bool_mask:
            mask = mask.masked_fill(~keep[:, None, :], -1e9)
        x = self.block(x, mask)
        for layer in self.layers:
            x = layer(x)
        return x


def test_a_block_given_a_mask_not_compared_is_no_culprit(settings: Settings) -> None:
    """A block given the model's mask, additive floats against the port's bools (shifted by one key): its output
    differs, its other input matches, the layers after it add nothing. Its mask pair is not one value computed two
    ways, not compared: whether the block was given what the reference's was is not known, so it is no culprit (it
    was named one once that pair's "error" no longer counted as its input's)."""
    x = torch.randn(2, 5, DIM, generator=torch.Generator().manual_seed(1))
    keep = torch.tensor([[True, True, True, False, False], [True, True, True, True, True]])
    for bool_mask, run in ((False, "reference"), (True, "candidate")):
        torch.manual_seed(0)
        model = MaskedFirst(bool_mask).eval()
        with torch.no_grad(), capture(model, "blocks", run, data_dir=settings.data_dir) as done:
            model(x, keep)
    assert done.session_id is not None
    report = compared(settings, done.session_id, modules=True)
    assert "MaskedFirst.block_inputs_args_1" in {o.name for o in report.coverage.out_of_step}
    assert report.first_divergence is not None and report.first_divergence.name == "MaskedFirst.block_outputs"
    modules = report.modules
    assert modules is not None
    assert modules.culprits == [] and modules.culprit is None, modules.culprits
