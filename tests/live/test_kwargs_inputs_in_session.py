"""A module input that goes into `**kwargs` on one side (the port's `forward(self, hidden_states, **kwargs)` called
with `attention_mask=m`) and to the parameter of that name on the other (the reference's `forward(self,
hidden_states, attention_mask=None, **kwargs)` called `attn(h, m)`) is one argument: the capture records the keyword
as `**attention_mask` (`live/parameters.py`), and the session's planning and find_divergence both pair it with the
reference's `attention_mask` (strategy "parameter through **kwargs", said in the pair's note). Before, nothing was
recorded for a `**kwargs` entry: the mask stayed unpaired on both sides, the session said it was incomplete, and
the attention a bug in its masked path lives in was named no culprit (its inputs "were not compared")."""

from __future__ import annotations

import html
import re
from functools import partial
from pathlib import Path
from typing import Any, cast

import httpx
import torch
from sqlalchemy import select
from tensor_debugger import capture, find_divergence
from tensor_debugger.services import open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store.models import TensorRecord
from torch import nn

from tests.support.servers import LiveServer, session_judged
from tests.support.source_lines import marked_line

D, T = 8, 6
NOTE = "paired by parameter name through **kwargs: one side passes this input by keyword into its forward's **kwargs"
line_of = partial(marked_line, Path(__file__))


class Attend(nn.Module):
    """The reference's attention, Hugging Face's way: the mask a named parameter, anything else into `**kwargs`."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k = nn.Linear(D, D), nn.Linear(D, D)

    def forward(
        self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs: Any
    ) -> torch.Tensor:
        assert attention_mask is not None
        s = self.q(hidden_states) @ self.k(hidden_states).transpose(-1, -2) * D**-0.5
        s = s.masked_fill(~attention_mask[:, None, :], torch.finfo(s.dtype).min)  # reference masked
        return cast(torch.Tensor, s.softmax(-1) @ hidden_states)


class AttendKwargs(nn.Module):
    """The port's attention: everything but the hidden states through `**kwargs`; with `bug`, the masked scores
    filled with 0 for the dtype's least value (the masked keys still weigh)."""

    def __init__(self, bug: bool = False) -> None:
        super().__init__()
        self.q, self.k = nn.Linear(D, D), nn.Linear(D, D)
        self.bug = bug

    def forward(self, hidden_states: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        mask = kwargs["attention_mask"]
        s = self.q(hidden_states) @ self.k(hidden_states).transpose(-1, -2) * D**-0.5
        s = s.masked_fill(~mask[:, None, :], 0.0 if self.bug else torch.finfo(s.dtype).min)  # port masked
        return cast(torch.Tensor, s.softmax(-1) @ hidden_states)


class Block(nn.Module):
    """The reference (`port` False) calls its attention `attn(x, keep)`; the port `attn(x, attention_mask=keep)`.
    `case`: "named" (that), "both" (the reference's attention takes the mask through `**kwargs` too, called as the
    port's), "extra" (the reference also passes `position_ids=`, which its attention's `**kwargs` takes and the
    port's call has not), "row 0" (the port's mask of every row taken from row 0)."""

    def __init__(self, port: bool, case: str = "named", bug: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.attn: nn.Module = AttendKwargs(bug) if port or case == "both" else Attend()
        self.out = nn.Linear(D, D)
        self.register_buffer("positions", torch.arange(T))
        self.port, self.case = port, case

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        if self.port and self.case == "row 0":
            h = self.attn(x, attention_mask=keep[:1].expand_as(keep))  # row 0
        elif self.port or self.case == "both":
            h = self.attn(x, attention_mask=keep)  # keyword
        elif self.case == "extra":
            h = self.attn(x, keep, position_ids=self.positions)  # extra keyword
        else:
            h = self.attn(x, keep)  # positional
        return cast(torch.Tensor, self.out(h))


class Overflow(nn.Module):
    """Its forward takes what follows `x` through `*args`."""

    def forward(self, x: torch.Tensor, *args: torch.Tensor) -> torch.Tensor:
        return x + sum(args, torch.zeros_like(x))


class Summed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.sum = Overflow()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self.sum(x, x * 2, x * 3))


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(2, T, D, generator=torch.Generator().manual_seed(5))
    keep = torch.ones(2, T, dtype=torch.bool)
    keep[0, 4:], keep[1, 3:] = False, False
    return x, keep


def _stored(settings: Settings, run_id: int) -> dict[str, str | None]:
    services = open_services(settings)
    try:
        with services.sessions() as db:
            rows = db.execute(select(TensorRecord.name, TensorRecord.parameter).where(TensorRecord.run_id == run_id))
            return {name: parameter for name, parameter in rows}
    finally:
        services.close()


def test_the_capture_records_kwargs_entries_by_their_keyword_and_args_by_their_position(settings: Settings) -> None:
    stored: dict[str, dict[str, str | None]] = {}
    for label, model in (("reference", Block(False, "extra")), ("port", Block(True))):
        with torch.no_grad(), capture(model.eval(), "bound", label, data_dir=settings.data_dir) as result:
            model(*_inputs())
        assert result.run_id is not None
        stored[label] = {n: p for n, p in _stored(settings, result.run_id).items() if n.startswith("Block.attn_in")}
    assert stored == {
        "reference": {
            "Block.attn_inputs_args_0": "hidden_states@0",
            "Block.attn_inputs_args_1": "attention_mask@1",
            "Block.attn_inputs_kwargs_position_ids": "**position_ids",
        },
        "port": {
            "Block.attn_inputs_args_0": "hidden_states@0",
            "Block.attn_inputs_kwargs_attention_mask": "**attention_mask",
        },
    }, stored
    summed = Summed()
    with torch.no_grad(), capture(summed, "bound", "overflow", data_dir=settings.data_dir) as result:
        summed(torch.ones(3))
    assert result.run_id is not None
    overflow = {n: p for n, p in _stored(settings, result.run_id).items() if n.startswith("Summed.sum_inputs")}
    assert overflow == {
        "Summed.sum_inputs_args_0": "x@0",
        "Summed.sum_inputs_args_1": "*1",
        "Summed.sum_inputs_args_2": "*2",
    }, overflow


def _answer_and_session(server: LiveServer, session: str, case: str, bug: bool) -> tuple[Any, dict[str, Any]]:
    """find_divergence's answer on the block (`case`, with `bug` in the port's masked path) and its session's
    pairs, once judged, read back from the server."""
    found = find_divergence(
        Block(False, case).eval(), Block(True, case, bug).eval(), _inputs(), session=session, server=server.url
    )
    with httpx.Client(base_url=server.url, timeout=30) as client:
        report = session_judged(client, int(found.location.rpartition("/sessions/")[2]))
    return found, report


def _alone(report: dict[str, Any]) -> list[str]:
    """The tensors the session left unpaired between the reference and the candidate's first run (the summary
    pass), by name: the second pass's runs record only the modules it asked for."""
    candidate = next(c["run_id"] for c in report["candidates"] if c["label"] == "candidate")
    return [u["name"] for u in report["unmatched"] if candidate in (u["run_id"], u["against_run_id"])]


def test_a_mask_through_kwargs_pairs_with_the_named_one_in_the_session_and_the_answer(
    shared_server: LiveServer,
) -> None:
    found, report = _answer_and_session(shared_server, "kwargs mask", "named", bug=False)
    assert found.first is None and found.unpaired == (0, 0), found.words()
    assert report["verdict"] == "no_divergence", report["verdict"]
    assert report["unmatched"] == [] and report["coverage"]["unmatched"] == [], report["unmatched"]
    assert {p["status"] for p in report["pairs"]} == {"pass"}
    through = {(p["a"]["name"], p["b"]["name"]): p for p in report["pairs"] if p["strategy"].startswith("parameter")}
    assert {k: p["strategy"] for k, p in through.items()} == {
        ("Block.attn_inputs_args_1", "Block.attn_inputs_kwargs_attention_mask"): "parameter through **kwargs"
    }, through
    mask = next(iter(through.values()))
    assert mask["pairing_note"].startswith(NOTE), mask
    page = html.unescape(httpx.get(f"{shared_server.url}/pairs/{mask['id']}", timeout=30).text)
    assert "paired by parameter through **kwargs" in page, page
    assert re.search(rf'<p class="meta" id="pairing-note">{re.escape(NOTE)}', page), page


def test_a_bug_in_the_masked_path_is_that_attentions_with_the_mask_through_kwargs(shared_server: LiveServer) -> None:
    """The port's masked scores filled with 0: the first divergence is the attention's `masked_fill` at its line on
    each side, and the attention is the culprit, its mask compared (passed); the session names the same tensor.
    Before, the mask was compared nowhere, so no culprit was named (failed on the parent commit)."""
    found, report = _answer_and_session(shared_server, "kwargs mask bug", "named", bug=True)
    first = found.first
    assert first is not None and first.reference == "Block.attn/masked_fill#1_outputs", found.words()
    assert (first.reference_source, first.candidate_source) == (line_of("reference masked"), line_of("port masked"))
    assert found.culprits == ["Block.attn"], found.words()
    assert found.unpaired == (0, 0) and found.uncompared_inputs == (), found.words()
    assert report["verdict"] == "diverged" and _alone(report) == [], report["unmatched"]
    assert report["coverage"]["unmatched"] == [], report["coverage"]
    assert report["first_divergence"]["name"] == first.reference, report["first_divergence"]
    mask = next(p for p in report["pairs"] if p["a"]["name"] == "Block.attn_inputs_args_1")
    assert mask["b"]["name"] == "Block.attn_inputs_kwargs_attention_mask" and mask["status"] == "pass", mask
    assert mask["strategy"] == "parameter through **kwargs", mask


def test_both_sides_kwargs_with_the_same_key_pair_by_name(shared_server: LiveServer) -> None:
    found, report = _answer_and_session(shared_server, "kwargs both", "both", bug=False)
    assert found.first is None and found.unpaired == (0, 0), found.words()
    assert _alone(report) == [] and report["coverage"]["unmatched"] == [], report["unmatched"]
    mask = next(p for p in report["pairs"] if p["a"]["name"] == "Block.attn_inputs_kwargs_attention_mask")
    assert mask["b"]["name"] == mask["a"]["name"] and mask["strategy"] == "name", mask
    assert mask["pairing_note"] is None, mask


def test_a_key_one_side_passes_alone_is_listed_one_sided_in_place(shared_server: LiveServer) -> None:
    """The reference also passes `position_ids=` into its attention's `**kwargs`: that input pairs with nothing and
    is listed as the reference's alone, before the attention's first pair; the mask still pairs. With the bug the
    first divergence is the same op, and the attention, one of whose inputs was not compared, is named no culprit
    but said so."""
    found, report = _answer_and_session(shared_server, "kwargs extra", "extra", bug=True)
    first = found.first
    assert first is not None and first.reference == "Block.attn/masked_fill#1_outputs", found.words()
    assert found.unpaired == (1, 0), found.words()
    assert "Block.attn_inputs_kwargs_position_ids" in first.unmatched_before, first
    assert found.uncompared_inputs == (("Block.attn", ("Block.attn_inputs_kwargs_position_ids",)),), found.words()
    assert found.culprits == [], found.words()
    candidate = next(c["run_id"] for c in report["candidates"] if c["label"] == "candidate")
    alone = [u for u in report["unmatched"] if u["against_run_id"] == candidate]
    assert [u["name"] for u in alone] == ["Block.attn_inputs_kwargs_position_ids"], alone
    assert report["coverage"]["unmatched"] == ["Block.attn_inputs_kwargs_position_ids"], report["coverage"]
    pairs = [p for p in report["pairs"] if p["b"]["run_id"] == candidate]
    after = next(p for p in pairs if p["position"] == alone[0]["before_position"])
    order = [p["a"]["name"] for p in pairs]
    assert order.index(after["a"]["name"]) == order.index("Block.attn_inputs_args_1") + 1, (after, order)
    assert report["first_divergence"]["name"] == first.reference, report["first_divergence"]
    mask = next(p for p in report["pairs"] if p["a"]["name"] == "Block.attn_inputs_args_1")
    assert mask["strategy"] == "parameter through **kwargs", mask


def test_a_mask_through_kwargs_that_differs_is_the_first_divergence_said_so(settings: Settings) -> None:
    """The port's mask of every row taken from row 0, through `**kwargs`: the first divergence is the mask itself,
    at each side's call, and the answer says how its two inputs were paired."""
    found = find_divergence(
        Block(False).eval(), Block(True, "row 0").eval(), _inputs(), session="row 0", data_dir=settings.data_dir
    )
    first = found.first
    assert first is not None and first.reference == "Block.attn_inputs_args_1", found.words()
    assert first.candidate == "Block.attn_inputs_kwargs_attention_mask", first
    assert (first.reference_source, first.candidate_source) == (line_of("positional"), line_of("row 0"))
    assert f"Its two inputs were {NOTE}" in found.words(), found.words()
