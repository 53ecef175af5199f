"""`find_divergence`'s answers, and the session's pages, on models of kinds its other tests do not build
(bench/RESULTS.md, "answers on unseen models, round 5"): each test holds one answer that was wrong or claimed too
much before its fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import torch
from tensor_debugger import capture, find_divergence
from tensor_debugger.settings import Settings
from torch import nn

from tests.support.polling import wait_until
from tests.support.servers import LiveServer
from tests.support.sessions import compared_with_unmatched as compared

HERE = Path(__file__)
DIM, HEADS = 8, 2


def line_of(marker: str) -> str:
    """`path:line` of the line of this file that ends with the comment `marker`."""
    lines = HERE.read_text(encoding="utf-8").splitlines()
    found = [i + 1 for i, text in enumerate(lines) if text.rstrip().endswith(f"# {marker}")]
    assert len(found) == 1, marker
    return f"{HERE}:{found[0]}"


class Scores(nn.Module):
    """Attention scores, scaled, masked and normalised; the port scales them twice (as MPT's port did)."""

    def __init__(self, twice: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k = nn.Linear(DIM, DIM), nn.Linear(DIM, DIM)
        self.twice = twice

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        scale = DIM**-0.5
        s = self.q(x) @ self.k(x).transpose(-1, -2) * scale  # scores scaled
        if self.twice:
            s = s * scale  # scaled again
        p: torch.Tensor = s.masked_fill(~keep[:, None, :], float("-inf")).softmax(-1)
        return p


def test_an_op_run_once_more_beside_its_twin_is_named_with_its_line_on_both_sides(settings: Settings) -> None:
    """The scale applied twice: the reference's `mul` and the port's two face none of each other's (either of the
    port's could be the reference's), so the first op that differs is the mask's `masked_fill`, past a pair (the
    mask's `invert`). The answer named the reference's `mul` without its line and none of the port's: the line of
    the bug (the second scale) was nowhere in it."""
    g = torch.Generator().manual_seed(1)
    x, keep = torch.randn(2, 5, DIM, generator=g), torch.ones(2, 5, dtype=torch.bool)
    keep[1, 3:] = False
    found = find_divergence(
        Scores(False).eval(), Scores(True).eval(), (x, keep), session="twice", data_dir=settings.data_dir
    )
    first = found.first
    assert first is not None and first.reference == "Scores/masked_fill#1_outputs", repr(found)
    assert first.unmatched_before == ("Scores/mul#1_outputs",), first
    assert first.unmatched_before_sources == (line_of("scores scaled"),), first
    assert first.candidate_unmatched_before == (
        ("Scores/mul#1_outputs", line_of("scores scaled")),
        ("Scores/mul#2_outputs", line_of("scaled again")),
    ), first
    words = repr(found)
    assert f"(the first: Scores/mul#1_outputs ({line_of('scores scaled')}))" in words, words
    assert f"Scores/mul#2_outputs ({line_of('scaled again')})" in words, words
    # the session's first divergence (JSON, CLI, pages) named the reference's mul and none of the port's either
    report, _ = compared(settings, 1)
    session_first = report.first_divergence
    assert session_first is not None and session_first.name == "Scores/masked_fill#1_outputs", session_first
    assert session_first.unmatched_before == ["Scores/mul#1_outputs"], session_first
    assert session_first.candidate_only_before == [
        f"Scores/mul#1_outputs ({line_of('scores scaled')})",
        f"Scores/mul#2_outputs ({line_of('scaled again')})",
    ], session_first


class Step(nn.Module):
    """One decoding step over a cache of keys and values, the keys turned by a toy rotary of the step's position; the
    port clamps positions to 3 (a table cut short): the same values up to position 3, other ones past it."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k, self.v = (nn.Linear(DIM, DIM) for _ in range(3))
        self.port = port
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor, position: int) -> torch.Tensor:
        angle = torch.arange(DIM // 2) * 0.1 * (min(position, 3) if self.port else position)  # step's angle
        self.keys.append(self.k(x) * torch.cat([angle.cos(), angle.cos()]))
        self.values.append(self.v(x))
        keys, values = torch.cat(self.keys), torch.cat(self.values)
        out: torch.Tensor = (self.q(x) @ keys.T * DIM**-0.5).softmax(-1) @ values
        return out


def test_a_summary_captures_session_page_says_what_its_verdicts_rest_on_not_a_printed_trace(
    shared_server: LiveServer,
) -> None:
    """Six decoding steps of each side, captured with level="op", values="summary" through a server: the first
    divergence is the fifth step's angle (position 4, the first past the port's table), at its line. The session
    page said "Element values are not available in this trace (written with use_repr=True): verdicts compare shapes
    and mean, std, min and max only": not what a summary capture is (the same for every find_divergence session,
    whose reference run is one)."""
    xs = torch.randn(6, 1, DIM, generator=torch.Generator().manual_seed(3))
    for run, port in (("reference", False), ("candidate", True)):
        model = Step(port).eval()
        with (
            torch.no_grad(),
            capture(model, "steps", run, server=shared_server.url, level="op", values="summary") as result,
        ):
            for position in range(6):
                model(xs[position], position)
    with httpx.Client(base_url=shared_server.url, timeout=30) as client:
        report: dict[str, Any] = wait_until(
            lambda: client.get(f"/api/sessions/{result.session_id}/pairs").json(),
            until=lambda got: got["pairs"] and not got["progress"]["pending"],
            what="the captured session's pairs to be judged",
            timeout=120,
            interval=0.05,
        )
        first = report["first_divergence"]
        assert first["name"] == "Step#5/mul#2_outputs", first
        assert first["reference_source"] == first["candidate_source"] == line_of("step's angle")
        page = client.get(f"/sessions/{result.session_id}").text
    assert "use_repr" not in page
    assert 'id="values-summarised">Element values are not available in the reference run: it was captured with' in page


class Wide(nn.Module):
    """A linear layer, a layer norm and another; the port computes it all in float64 (its input cast first)."""

    def __init__(self, float64: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.norm, self.b = nn.Linear(DIM, 16), nn.LayerNorm(16), nn.Linear(16, DIM)
        self.float64 = float64
        if float64:
            self.double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.float64:
            x = x.double()
        out: torch.Tensor = self.b(self.norm(self.a(x)))  # first float64 op
        return out


def test_a_float64_candidate_drifts_from_its_first_op_not_from_its_input_cast(settings: Settings) -> None:
    """A float32 reference against the same model in float64: precision drift, no divergence. The answer said the
    values "differ within tolerance from Wide.a_inputs_args_0 on": the input, the same values in another dtype (its
    hash covers the dtype; every statistic and sampled value is equal). The drift begins at the first op computed in
    float64."""
    x = torch.randn(4, DIM, generator=torch.Generator().manual_seed(4))
    found = find_divergence(Wide(False).eval(), Wide(True).eval(), x, session="float64", data_dir=settings.data_dir)
    assert found.first is None and found.culprits == [], repr(found)
    assert found.changed == ("Wide.a/linear#1_outputs", line_of("first float64 op")), found.changed
    assert "values differ (content hashes) from Wide.a/linear#1_outputs" in repr(found)
    assert found.changed_full is not None and found.changed_full.passed, found.changed_full


def test_no_difference_in_tensors_without_elements_says_no_value_was_compared(settings: Settings) -> None:
    """An empty batch (0 rows) into a port that doubles its output: every pair is equal, having no elements, and the
    answer was a plain "no difference found in 6 pairs of summaries"."""

    class Double(nn.Module):
        def __init__(self, factor: float) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.a, self.factor = nn.Linear(DIM, DIM), factor

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.a(x) * self.factor
            return out

    found = find_divergence(
        Double(1.0).eval(), Double(2.0).eval(), torch.randn(0, DIM), session="empty", data_dir=settings.data_dir
    )
    assert found.first is None and found.empty == found.compared > 0, repr(found)
    assert "Every one of those pairs held no elements (an empty input?): no value of theirs was compared." in repr(
        found
    )
