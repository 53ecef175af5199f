"""A first divergence found on a module's input has a source line: the line of code that passed it, the module's
caller (as an op's is its caller), recorded by a capture. A tiny Llama built by transformers against the same model
with a bug in its attention's own code, after the attention and before o_proj (in no module of its own): the first
divergence is o_proj's input, passed at `attn_output = self.o_proj(attn_output)` in modeling_llama.py, in the JSON,
the CLI's words and the session page. Where the runs were read from files (transformers' own trace, which records
no lines), the answer says plainly why there is none."""

from __future__ import annotations

import html
import json
import linecache
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from tensor_debugger import capture, find_divergence
from tensor_debugger.cli.compare_output import print_first_divergence
from tensor_debugger.compare.reports.contract import compare_report
from tensor_debugger.settings import Settings

from tests.support import loopback_http as http
from tests.support.cli_main import main_cli
from tests.support.servers import LiveServer, wait_done
from tests.support.sessions import compared, session_id_of
from tests.support.traces import input_ids, tiny_llama, write_trace

O_PROJ_INPUT = "LlamaForCausalLM.model.layers.1.self_attn.o_proj_inputs_args_0"


def line_of(source: str | None) -> str:
    """The text of the line a source names ("<file>:<line>")."""
    assert source is not None
    path, _, number = source.rpartition(":")
    return linecache.getline(path, int(number)).strip()


@pytest.mark.parametrize("level", ["module", "op"])
def test_a_first_divergence_on_a_modules_input_names_the_line_that_passed_it(
    settings: Settings, capsys: pytest.CaptureFixture[str], level: Any
) -> None:
    for model, run in ((tiny_llama(), "reference"), (tiny_llama(inner_bug=True), "candidate")):
        with torch.no_grad(), capture(model, "inner", run, data_dir=settings.data_dir, level=level):
            model(input_ids())
    session_id = session_id_of(settings, "inner")
    report = compared(settings, session_id, modules=True)
    first = report.first_divergence
    assert first is not None and first.name == O_PROJ_INPUT, first
    assert first.reference_source is not None and "modeling_llama.py:" in first.reference_source, first
    assert (
        line_of(first.reference_source) == line_of(first.candidate_source) == "attn_output = self.o_proj(attn_output)"
    )
    assert first.source_note is None and first.place == "inputs_args_0"
    typed = compare_report(session_id, "inner", "http://127.0.0.1/sessions/1", report, [])
    pair = typed.pair_named(O_PROJ_INPUT)
    assert pair.a.source == first.reference_source and pair.b.source == first.candidate_source  # `source` in JSON
    assert typed.first_divergence is not None and typed.first_divergence.source_note is None
    print_first_divergence(typed, typed.first_divergence)
    said = capsys.readouterr().out
    assert f"FIRST DIVERGENCE: {O_PROJ_INPUT} (layer 1, passed at modeling_llama.py:" in said, said
    # the modules' inputs of a capture each have their caller's line; their ops stay apart from them in the op lists
    assert all(p.a.source for p in report.pairs if (p.place or "").startswith("inputs")), [
        p.name for p in report.pairs if (p.place or "").startswith("inputs") and not p.a.source
    ]
    model_input = next(p for p in report.pairs if p.name == "LlamaForCausalLM_inputs_args_0")
    assert line_of(model_input.a.source) == "model(input_ids())"  # this test's own line: the model's caller


def test_find_divergence_says_where_a_modules_input_was_passed(settings: Settings) -> None:
    found = find_divergence(
        tiny_llama(), tiny_llama(inner_bug=True), (input_ids(),), session="inner found", data_dir=settings.data_dir
    )
    assert found.first is not None and found.first.reference == O_PROJ_INPUT, found.first
    assert line_of(found.first.reference_source) == "attn_output = self.o_proj(attn_output)"
    assert f"{O_PROJ_INPUT} (passed at {found.first.reference_source} in the reference" in found.words()


def test_runs_read_from_files_say_why_their_modules_input_has_no_line(tmp_path: Path) -> None:
    """transformers' `model_addition_debugger_context` traces (files, no lines of code): the answer, JSON and
    words, says there is no source line and why."""
    reference = write_trace(tmp_path / "reference")
    candidate = write_trace(tmp_path / "candidate", inner_bug=True)
    done = main_cli("--data-dir", str(tmp_path / "data"), "compare", str(reference), str(candidate), "--json")
    out = json.loads(done.stdout)
    first = out["first_divergence"]
    assert first["name"] == O_PROJ_INPUT, first
    pair = next(p for p in out["pairs"] if p["name"] == O_PROJ_INPUT)
    assert pair["a"]["source"] is None and pair["b"]["source"] is None
    assert first["source_note"] == (
        "no source line: the reference and the candidate did not record which line of code passed this input (a "
        "capture records the line that called the module, where that line is outside torch; a trace or dump read "
        "from files records none)"
    )
    table = main_cli("--data-dir", str(tmp_path / "data2"), "compare", str(reference), str(candidate))
    assert f"FIRST DIVERGENCE: {O_PROJ_INPUT} (layer 1; no source line: the reference and" in table.stdout


def test_the_session_page_names_the_line_that_passed_the_input(shared_server: LiveServer) -> None:
    """Captured into a server (a trace folder, uploaded and ingested there): the session page's first divergence
    says where o_proj's input was passed."""
    for model, run in ((tiny_llama(), "reference"), (tiny_llama(inner_bug=True), "candidate")):
        with torch.no_grad(), capture(model, "inner on a server", run, server=shared_server.url) as result:
            model(input_ids())
    assert result.session_id is not None
    wait_done(shared_server, result.session_id)
    page = http.get(f"{shared_server.url}/sessions/{result.session_id}", headers=shared_server.auth).text
    found = re.search(r'<span class="op-source" id="first-divergence-source" title="([^"]*)">(.*?)</span>', page)
    assert found is not None, page
    assert html.unescape(found[2]).startswith("passed at modeling_llama.py:"), found[2]
    assert "first-divergence-source-note" not in page
