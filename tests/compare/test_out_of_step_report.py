"""Pairs of captured ops out of step (one implementation calls an op more often in a module call: eager attention's
repeat_kv reshapes against SDPA's none) are not one value computed two ways: the first divergence passes over them,
and the session's verdict and coverage do not count them as compared. Where nothing else fails, the session is
incomplete, naming them, not diverged."""

from __future__ import annotations

import pytest
import torch
from tensor_debugger import capture
from tensor_debugger.cli.compare_output import print_not_compared
from tensor_debugger.cli.session_diff import incomplete
from tensor_debugger.compare.reports.contract import compare_report
from tensor_debugger.settings import Settings

from tests.live.test_op_capture import compared
from tests.live.test_unseen_answers import DIM, EagerAttention


def test_ops_out_of_step_are_not_compared_and_leave_the_session_incomplete(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    x = torch.randn(2, 5, DIM, generator=torch.Generator().manual_seed(1))
    for model, run in ((EagerAttention(False), "reference"), (EagerAttention(True, 1.0), "candidate")):
        with (
            torch.no_grad(),
            capture(model.eval(), "eager", run, data_dir=settings.data_dir, level="op", values="summary"),
        ):
            model(x)
    report, _ = compared(settings, 1)

    failing = {p.name for p in report.pairs if p.status == "fail"}
    assert failing == {"EagerAttention/reshape#1_outputs", "EagerAttention/transpose#4_outputs"}
    assert report.first_divergence is None  # both passed over as ops out of step
    assert str(report.verdict) == "incomplete"
    out_of_step = {o.name: o.why for o in report.coverage.out_of_step}
    assert failing <= set(out_of_step)
    assert (
        out_of_step["EagerAttention/reshape#1_outputs"]
        == "ops out of step: one side calls reshape more often in the model"
    )
    # what is out of step is not counted as compared
    assert (
        report.coverage.compared + len(out_of_step) + len(report.coverage.unmatched)
        <= report.coverage.reference_tensors
    )

    cli = compare_report(1, "eager", "http://127.0.0.1/", report, [])
    assert cli.verdict == "incomplete"
    assert cli.coverage is not None
    assert {o.name for o in cli.coverage.out_of_step} == set(out_of_step)
    print_not_compared(cli)
    text = capsys.readouterr().out
    assert "NOT COMPARED: pair EagerAttention/reshape#1_outputs (ops out of step: one side calls reshape more" in text
    # compare-sessions' words for an incomplete session
    words = incomplete(report.coverage)
    assert f"{len(out_of_step)} pairs of ops out of step were not compared (EagerAttention/" in words
