"""The model graph's page reads only the module view and the first divergence (pair_reports.session_modules), not
the session's whole report: what it shows must be what the whole report (session_pairs with modules) gives, for a
compared trace with a first divergence and a culprit."""

from __future__ import annotations

import json
from pathlib import Path

from tensor_debugger.compare.reports.module_reports import ModuleNodeReport
from tensor_debugger.compare.reports.pair_reports import session_modules, session_pairs
from tensor_debugger.services import open_services
from tensor_debugger.settings import Settings
from tensor_debugger.web.views.module_graph import build_graph, graph_html

from tests.support.cli_main import main_cli
from tests.support.traces import MODEL_CLASS, WrittenTraces

BUG_MODULE = f"{MODEL_CLASS}.model.layers.1.self_attn.o_proj"


def test_the_graph_data_equals_the_whole_reports(tmp_path: Path, hf_traces: WrittenTraces) -> None:
    data_dir = tmp_path / "data"
    done = main_cli(
        "--data-dir", str(data_dir), "compare", str(hf_traces["eager"]), str(hf_traces["bf16_bug"]), "--json"
    )
    assert done.returncode == 1, done.stderr
    session_id = json.loads(done.stdout)["session"]["id"]
    services = open_services(Settings(data_dir=data_dir, demo=False))
    try:
        with services.sessions() as db:
            whole = session_pairs(db, session_id, modules=True, cache=services.stats)
            light = session_modules(db, session_id, cache=services.stats)
    finally:
        services.close()
    assert whole.modules is not None and whole.first_divergence is not None
    assert [c.module_path for c in whole.modules.culprits] == [BUG_MODULE]  # a session with a culprit...
    assert light.modules == whole.modules and light.first_divergence == whole.first_divergence.pair_id
    for query in ("", "o_proj"):  # ...whose graph, folded or searched, is the same either way
        expected = graph_html(build_graph(whole.modules, whole.first_divergence.pair_id, query))
        assert graph_html(build_graph(light.modules, light.first_divergence, query)) == expected
    # each module counts the modules below it with a pair of their own that failed or was not compared
    for node in walk(whole.modules.tree):
        below = [m for c in node.children for m in walk([c])]
        assert node.failing_inside == sum(
            1 for m in below if any(p.status in ("error", "incomparable", "fail") for p in m.pairs)
        )
    assert whole.modules.tree[0].failing_inside > 0


def walk(nodes: list[ModuleNodeReport]) -> list[ModuleNodeReport]:
    return [m for n in nodes for m in (n, *walk(n.children))]
