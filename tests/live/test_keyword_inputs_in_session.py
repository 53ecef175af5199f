"""A module's input passed by keyword in one run and by position in the other (`self.attn(x=x, keep=mask)` against
`self.attn(x, keep)`) pairs in the session as in find_divergence's answer: the capture records the parameter of the
module's `forward` each argument binds to, the run stores it, and both the session's planning and find_divergence
pair by it (strategy `parameter`). Before, find_divergence paired them by reading the models' signatures while the
session, from the same stored runs, left those inputs unpaired and said it was incomplete (bench/RESULTS.md, "answers
on unseen models, round 7", "Left, seen on the way")."""

from __future__ import annotations

import re
from functools import partial
from typing import Any

import httpx
import torch
from sqlalchemy import select
from tensor_debugger import capture, find_divergence
from tensor_debugger.services import open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store.models import TensorRecord

from tests.live.test_unseen_answers_7 import Keywords, _keep
from tests.support.servers import LiveServer, session_judged

NOTE = "paired by parameter: one side passes this input by keyword and the other by position"


def _answer_and_session(server: LiveServer, bug: bool, session: str) -> tuple[Any, dict[str, Any], set[str]]:
    """find_divergence's answer on the keywords block (with `bug`, its mask from row 0), its session's pairs
    once judged, and the candidate's tensors the session left unpaired."""
    model = partial(Keywords, bug=bug)
    inputs = _keep(torch.Generator().manual_seed(5))
    found = find_divergence(model(False).eval(), model(True).eval(), inputs, session=session, server=server.url)
    session_id = int(found.location.rpartition("/sessions/")[2])
    with httpx.Client(base_url=server.url, timeout=30) as client:
        report = session_judged(client, session_id)
        # every tensor of the candidate's first run has a partner too (the session lists the reference's unpaired)
        candidate = next(c["run_id"] for c in report["candidates"] if c["label"] == "candidate")
        names = {t["name"] for t in client.get(f"/api/runs/{candidate}/tensors").json()}
    paired = {p["b"]["name"] for p in report["pairs"] if p["b"]["run_id"] == candidate}
    return found, report, names - paired


def test_the_capture_stores_the_parameter_each_module_input_binds_to(settings: Settings) -> None:
    inputs = _keep(torch.Generator().manual_seed(5))
    for port, session in ((False, "positional"), (True, "keywords")):
        model = Keywords(port).eval()
        with torch.no_grad(), capture(model, session, "run", data_dir=settings.data_dir) as result:
            model(*inputs)
        assert result.run_id is not None
        services = open_services(settings)
        try:
            with services.sessions() as db:
                rows = db.execute(
                    select(TensorRecord.name, TensorRecord.parameter).where(TensorRecord.run_id == result.run_id)
                ).all()
        finally:
            services.close()
        bound = {name: parameter for name, parameter in rows if name.startswith("Keywords.attn_inputs")}
        assert bound == (
            {"Keywords.attn_inputs_kwargs_x": "x@0", "Keywords.attn_inputs_kwargs_keep": "keep@1"}
            if port
            else {"Keywords.attn_inputs_args_0": "x@0", "Keywords.attn_inputs_args_1": "keep@1"}
        ), bound
        # the model's own inputs bind to its forward's parameters; its outputs and ops to none
        parameters = {name: parameter for name, parameter in rows}
        assert parameters["Keywords_inputs_args_0"] == "x@0" and parameters["Keywords_inputs_args_1"] == "keep@1"
        assert parameters["Keywords_outputs"] is None and parameters["Keywords.attn_outputs"] is None


def test_keyword_inputs_pair_with_positional_ones_in_the_session_as_in_the_answer(shared_server: LiveServer) -> None:
    """The same model called with keywords: the session pairs the attention's inputs (strategy `parameter`, its note
    in the pair's JSON) and judges every pair, as the answer compares them."""
    found, report, alone = _answer_and_session(shared_server, False, "keywords in session")
    assert alone == set(), alone
    assert found.first is None and found.unpaired == (0, 0), found.words()
    assert report["verdict"] == "no_divergence", report["verdict"]
    assert report["unmatched"] == [] and report["coverage"]["unmatched"] == [], report["coverage"]
    assert {p["status"] for p in report["pairs"]} == {"pass"}, {p["name"]: p["status"] for p in report["pairs"]}
    by_parameter = {(p["a"]["name"], p["b"]["name"]): p for p in report["pairs"] if p["strategy"] == "parameter"}
    assert set(by_parameter) == {
        ("Keywords.attn_inputs_args_0", "Keywords.attn_inputs_kwargs_x"),
        ("Keywords.attn_inputs_args_1", "Keywords.attn_inputs_kwargs_keep"),
    }, by_parameter
    assert all(p["pairing_note"].startswith(NOTE) for p in by_parameter.values())
    # the pair page says it too
    mask = by_parameter[("Keywords.attn_inputs_args_1", "Keywords.attn_inputs_kwargs_keep")]
    page = httpx.get(f"{shared_server.url}/pairs/{mask['id']}", timeout=30).text
    assert re.search(rf'<p class="meta" id="pairing-note">{re.escape(NOTE)}', page), page


def test_a_keyword_mask_that_differs_is_the_sessions_first_divergence_as_the_answers(
    shared_server: LiveServer,
) -> None:
    """The port's mask of every row taken from row 0, passed by keyword: the answer names the attention's mask input
    first; the session, from the same runs, names the same tensor (before, it left it unpaired)."""
    found, report, alone = _answer_and_session(shared_server, True, "keyword mask in session")
    assert found.first is not None and found.first.reference == "Keywords.attn_inputs_args_1", found.words()
    assert report["verdict"] == "diverged", report["verdict"]
    assert report["first_divergence"]["name"] == found.first.reference, report["first_divergence"]
    mask = next(p for p in report["pairs"] if p["a"]["name"] == "Keywords.attn_inputs_args_1")
    assert mask["b"]["name"] == "Keywords.attn_inputs_kwargs_keep" and mask["status"] == "fail", mask
    # both say how the two were paired
    assert mask["pairing_note"].startswith(NOTE), mask
    assert f"Its two inputs were {NOTE}" in found.words(), found.words()
    assert report["coverage"]["unmatched"] == [], report["coverage"]
    assert alone == {"Keywords/getitem#1_outputs", "Keywords/expand_as#1_outputs"}, alone  # the port's mask's ops
