"""A session of two summary op captures says of its first divergence what `find_divergence`'s answer says from
what the session stores, in the same words: the candidate's tensors recorded where the reference records them only
after it (a norm called before the rotary, paired ops that agree lying between: the two runs' orders), and the
reference's tensor that holds, bit for bit, what the candidate's holds there (a cache given the keys before their
rotary: content hashes). What needs the models (a module called again on the reference's inputs, its parameters and
buffers, the precision floor) it does not claim: it says, in one sentence, that find_divergence can check it. Each
fact in the report, in `compare --json`, in the CLI's lines and on the session's page."""

from __future__ import annotations

import html
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import torch
from tensor_debugger import capture, find_divergence
from tensor_debugger.cli.compare_output import print_table
from tensor_debugger.compare.reports.compare_report import HeldBefore, ModelCheck, RecordedEarly, to_json
from tensor_debugger.compare.reports.contract import compare_report
from tensor_debugger.compare.reports.divergence_words import checks_words, early_words, holds_words
from tensor_debugger.compare.reports.pair_reports import FirstDivergence, SessionPairs
from tensor_debugger.settings import Settings
from torch import nn

from tests.live.test_unseen_answers_9 import HalfScores
from tests.live.test_unseen_answers_11 import IDS, Decode, Normed
from tests.live.test_unseen_answers_11 import line_of as line_of_11
from tests.support.servers import LiveServer, session_judged
from tests.support.sessions import compared, session_id_of
from tests.support.source_lines import marked_line

D = 16
line_of = partial(marked_line, Path(__file__))
X = torch.randn(2, 6, D, generator=torch.Generator().manual_seed(7))


class NormedFirst(nn.Module):
    """A query turned by a rotary written inline (its angles' ops agree on both sides), then normed; the port norms
    it before the rotary (HunYuan's QK-norm, round 11, by hand)."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q = nn.Linear(D, D)
        self.norm = nn.LayerNorm(D)
        self.register_buffer("inv", 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D)), persistent=False)
        self.inv: torch.Tensor
        self.port = port

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.q(x)
        if self.port:
            q = self.norm(q)  # port normed
        angles = torch.arange(x.shape[1])[:, None].float() * self.inv[None]
        q = q * torch.cat([angles, angles], -1).cos()  # turned
        if not self.port:
            q = self.norm(q)  # normed
        return cast(torch.Tensor, q)


class MaskedTwice(nn.Module):
    """Scores masked by a causal mask, then by a second one; the port's first lets each token see the next, which
    the second takes out again (GPT-Neo's mask buffer built with `tril(..., 1)`, round 10, by hand)."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q = nn.Linear(D, D)
        self.port = port

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.q(x)
        scores = q @ q.transpose(-1, -2)
        t = scores.shape[-1]
        seen = torch.ones(t, t, dtype=torch.bool).tril(1 if self.port else 0)  # first mask
        scores = scores.masked_fill(~seen, float("-inf"))
        scores = scores.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
        return cast(torch.Tensor, scores.softmax(-1))


def summary_session(
    settings: Settings, model: Callable[[bool], nn.Module], name: str, *inputs: Any
) -> tuple[int, SessionPairs]:
    """The session of two summary op captures (`model(False)` the reference's, `model(True)` the candidate's) into
    `settings`' data dir, planned and compared: its id and its pairs' report."""
    for run, port in (("reference", False), ("candidate", True)):
        instance = model(port).eval()
        with torch.no_grad(), capture(instance, name, run, data_dir=settings.data_dir, level="op", values="summary"):
            instance(*inputs)
    session_id = session_id_of(settings, name)
    return session_id, compared(settings, session_id, modules=True)


def said(
    session_id: int, name: str, report: SessionPairs, capsys: pytest.CaptureFixture[str]
) -> tuple[str, dict[str, Any]]:
    """What `compare` prints of the session (its table and the lines under it) and its `--json` first divergence."""
    contract = compare_report(session_id, name, "http://127.0.0.1/", report, [])
    capsys.readouterr()
    print_table(contract)
    first: dict[str, Any] = to_json(contract)["first_divergence"]
    return capsys.readouterr().out, first


def first_of(report: SessionPairs) -> FirstDivergence:
    first = report.first_divergence
    assert first is not None
    return first


def test_a_norm_called_before_the_rotary_is_named_by_the_sessions_first_divergence(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    """The port's norm, called before the rotary where the reference calls it after: the session names its tensors
    (past the rotary's angle ops, paired and equal, between them and the divergence) with their lines and their
    partners', in the sentence find_divergence's answer says."""
    found = find_divergence(
        NormedFirst(False).eval(), NormedFirst(True).eval(), X, session="normed first fd", data_dir=settings.data_dir
    )
    assert found.first is not None and found.first.candidate_early_before, repr(found)
    session_id, report = summary_session(settings, NormedFirst, "normed first", X)
    first = first_of(report)
    assert first.name == found.first.reference == "NormedFirst/mul#2_outputs", first
    expected = [RecordedEarly(*e) for e in found.first.candidate_early_before]
    assert first.candidate_early_before == expected, first.candidate_early_before
    norm = {e.candidate: e for e in expected}["NormedFirst.norm/layer_norm#1_outputs"]
    assert (norm.candidate_source, norm.reference_source) == (line_of("port normed"), line_of("normed")), norm
    words = first.early_words
    assert words.startswith("Before it, the candidate recorded "), words
    assert f" {words} " in repr(found), (words, repr(found))  # the same sentence, the same tensors and lines
    assert first.candidate_holds is None and first.holds_words == ""
    printed, json_first = said(session_id, "normed first", report, capsys)
    assert json_first["candidate_early_before"] == [
        {"candidate": e.candidate, "candidate_source": e.candidate_source, "reference_source": e.reference_source}
        for e in expected
    ], json_first
    assert f"\n{words}\n" in printed, printed


def test_a_cache_given_keys_before_their_rotary_is_said_to_hold_them_by_the_session(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    """Round 11's decode step over a cache the port fills before the rotary: the session's first divergence (the
    cache passed to the decode step) holds, by its content hash, the reference's keys as its rotary was given them:
    named with that line, in find_divergence's words; a module's input, so nothing for find_divergence to check."""
    found = find_divergence(
        Decode(False).eval(), Decode(True).eval(), (IDS,), session="cache fd", data_dir=settings.data_dir
    )
    session_id, report = summary_session(settings, Decode, "cache", IDS)
    first = first_of(report)
    assert first.name == "Decode.attn#2_inputs_args_1_0", first
    held = HeldBefore("Decode.attn#2_inputs_args_1_0", "Decode.attn.rot#2_inputs_args_0", line_of_11("keys turned"))
    assert first.candidate_holds == held, first.candidate_holds
    assert f" {first.holds_words} " in repr(found), (first.holds_words, repr(found))
    assert first.candidate_early_before == [] and first.find_divergence_checks == [] and first.checks_words == ""
    printed, json_first = said(session_id, "cache", report, capsys)
    assert json_first["candidate_holds"] == {
        "candidate": held.candidate,
        "reference": held.reference,
        "reference_source": held.reference_source,
    }, json_first
    assert json_first["find_divergence_checks"] == []
    assert f"\n{first.holds_words}\n" in printed, printed


def test_what_needs_the_models_is_left_to_find_divergence_in_one_sentence(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    """The session claims none of what needs the models: where a pair before its first divergence differs within
    tolerance (round 11's norm squaring in bfloat16), it says find_divergence can replay the module; where its
    inputs agree bit for bit (the port's norm in another place), that find_divergence can compare its parameters and
    buffers; where the candidate computes in a lower precision (round 9's scores in bfloat16), its precision floor."""
    x = torch.randn(4, 8, D, generator=torch.Generator().manual_seed(2)).bfloat16() * 3
    cases: list[tuple[str, Callable[[bool], nn.Module], Any, list[ModelCheck], str]] = [
        (
            "grown",
            lambda port: Normed(port).bfloat16(),
            x,
            [ModelCheck.GROWN],
            "whether Normed.b diverges by its own doing or by its inputs' difference within tolerance grown past it",
        ),
        ("state", NormedFirst, X, [ModelCheck.STATE], "whether NormedFirst's parameters or buffers differ"),
        ("floor", HalfScores, X, [ModelCheck.STATE, ModelCheck.FLOOR], "beyond the rounding to bfloat16"),
    ]
    for name, model, inputs, checks, clause in cases:
        session_id, report = summary_session(settings, model, name, inputs)
        first = first_of(report)
        assert first.find_divergence_checks == checks, (model, first)
        words = first.checks_words
        assert words.startswith("What needs the two models, find_divergence(reference, candidate, inputs) can "), words
        assert clause in words and words.endswith(".") and ". " not in words, words  # one sentence
        printed, json_first = said(session_id, name, report, capsys)
        assert json_first["find_divergence_checks"] == [str(c) for c in checks], json_first
        assert f"\n{words}\n" in printed, printed


def test_the_session_page_and_api_say_them(shared_server: LiveServer) -> None:
    """Captured into a server: the pairs API's first divergence carries the facts, and the session's page says
    them in the same words."""
    sessions = {}
    for model, inputs, name in ((NormedFirst, X, "normed first in a server"), (Decode, IDS, "cache in a server")):
        session_id = 0
        for run, port in (("reference", False), ("candidate", True)):
            instance = model(port).eval()
            into = capture(instance, name, run, server=shared_server.url, level="op", values="summary")
            with torch.no_grad(), into as done:
                instance(inputs)
            assert done.session_id is not None
            session_id = done.session_id
        with httpx.Client(base_url=shared_server.url, timeout=30, headers=shared_server.auth) as client:
            api = session_judged(client, session_id)["first_divergence"]
            answer = client.get(f"/sessions/{session_id}")
            assert answer.status_code == 200, answer.text
        sessions[model] = (api, html.unescape(answer.text))
    api, page = sessions[NormedFirst]
    early = [RecordedEarly(**e) for e in api["candidate_early_before"]]
    assert {e.candidate for e in early} >= {"NormedFirst.norm_outputs", "NormedFirst.norm/layer_norm#1_outputs"}, api
    assert api["find_divergence_checks"] == ["parameters and buffers"], api
    assert f'<span class="early-before" id="early-before">{early_words(early)}</span>' in page
    checks = checks_words(api["name"], [ModelCheck(c) for c in api["find_divergence_checks"]])
    assert f'<span class="find-divergence-checks" id="find-divergence-checks">{checks}</span>' in page
    assert 'id="candidate-holds"' not in page
    api, page = sessions[Decode]
    held = HeldBefore(**api["candidate_holds"])
    assert held.reference == "Decode.attn.rot#2_inputs_args_0", api
    assert f'<span class="candidate-holds" id="candidate-holds">{holds_words(held)}</span>' in page
    assert 'id="early-before"' not in page and 'id="find-divergence-checks"' not in page
    assert 'id="outputs-agree"' not in page  # the decode step's probabilities differ


def test_a_divergence_taken_out_again_is_said_not_to_reach_the_models_outputs(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    """A first mask letting one future token through, a second taking it out: the session's first divergence (the
    first mask) is said, as find_divergence says it, not to reach the models' own outputs, which are bit-identical
    by their content hashes; a session whose outputs differ says nothing of it."""
    found = find_divergence(
        MaskedTwice(False).eval(), MaskedTwice(True).eval(), X, session="masked fd", data_dir=settings.data_dir
    )
    assert found.outputs_agree and found.first is not None, repr(found)
    session_id, report = summary_session(settings, MaskedTwice, "masked", X)
    first = first_of(report)
    assert first.name == found.first.reference, (first, repr(found))
    assert first.outputs_agree, first
    assert f" {first.outputs_agree_words} " in repr(found), (first.outputs_agree_words, repr(found))
    printed, json_first = said(session_id, "masked", report, capsys)
    assert json_first["outputs_agree"] is True, json_first
    assert f"\n{first.outputs_agree_words}\n" in printed, printed
    _, other = summary_session(settings, NormedFirst, "outputs differ", X)
    assert first_of(other).outputs_agree is False and first_of(other).outputs_agree_words == ""


def test_a_session_find_divergence_stored_does_not_send_the_user_to_find_divergence(
    settings: Settings, shared_server: LiveServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """The session find_divergence stored itself (its second capture with full values beside the summaries) said
    "What needs the two models, find_divergence(reference, candidate, inputs) can check": find_divergence, holding
    the models, already did, and its answer says what it found. Not said there, by the report, the command's lines,
    its JSON, the API or the page; the two summary captures of the same models still say it (above)."""
    found = find_divergence(
        NormedFirst(False).eval(), NormedFirst(True).eval(), X, session="state fd", data_dir=settings.data_dir
    )
    assert found.first is not None and found.first.reference == "NormedFirst/mul#2_outputs", repr(found)
    session_id = session_id_of(settings, "state fd")
    report = compared(settings, session_id, modules=True)
    for candidate in report.candidates:  # "candidate", and its second capture, "candidate (full)"
        if candidate.first_divergence is not None:
            assert candidate.first_divergence.find_divergence_checks == [], candidate
    first = first_of(report)
    assert first.name == "NormedFirst/mul#2_outputs" and first.checks_words == ""
    printed, json_first = said(session_id, "state fd", report, capsys)
    assert json_first["find_divergence_checks"] == [] and "find_divergence(reference" not in printed, printed
    _, summaries = summary_session(settings, NormedFirst, "state summaries", X)
    assert first_of(summaries).find_divergence_checks == [ModelCheck.STATE]  # what the session alone cannot know

    served = find_divergence(
        NormedFirst(False).eval(), NormedFirst(True).eval(), X, session="state fd served", server=shared_server.url
    )
    with httpx.Client(base_url=shared_server.url, timeout=30, headers=shared_server.auth) as client:
        listed = client.get("/api/sessions", params={"q": served.session}).json()
        (session,) = [s for s in listed if s["name"] == served.session]
        api = session_judged(client, session["id"])
        page = html.unescape(client.get(f"/sessions/{session['id']}").text)
    assert api["first_divergence"]["name"] == "NormedFirst/mul#2_outputs", api["first_divergence"]
    assert api["first_divergence"]["find_divergence_checks"] == [], api["first_divergence"]
    assert 'id="find-divergence-checks"' not in page and "find_divergence(reference" not in page
