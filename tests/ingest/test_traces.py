"""Hugging Face debugger traces generated here from a tiny random Llama: reading, pairing, verdicts, culprits."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from tensor_debugger.cli.compare import run_compare
from tensor_debugger.cli.compare_output import compare_request
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.services import Services
from tensor_debugger.store.models import RunRecord, TensorRecord

from tests.support.dumps import make_tar
from tests.support.servers import LiveServer
from tests.support.traces import MODEL_CLASS, TRACES, WrittenTraces

DOWN_PROJ = f"{MODEL_CLASS}.model.layers.1.mlp.down_proj"
MASKS = [
    f"{MODEL_CLASS}.model.layers.{n}{part}_inputs_kwargs_attention_mask"
    for n in range(2)
    for part in ("", ".self_attn")
]


@pytest.fixture(scope="module")
def traces(hf_traces: WrittenTraces) -> dict[str, Path]:
    """Written once for the run (conftest's hf_traces) and only read by the tests."""
    return {name: hf_traces[name] for name in TRACES}


def compare(services: Services, capsys: pytest.CaptureFixture[str], a: Path, b: Path) -> tuple[int, dict[str, Any]]:
    code = run_compare(services, compare_request(a, b, None, None, None), True)
    return code, json.loads(capsys.readouterr().out)


def test_two_attention_implementations_pass_with_the_masks_unmatched(
    services: Services, traces: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    # sdpa is given no mask (it is None there): every pair passes, but the masks were not compared
    code, out = compare(services, capsys, traces["eager"], traces["sdpa"])
    assert code == 1 and out["verdict"] == "incomplete", [p["name"] for p in out["pairs"] if p["status"] != "pass"]
    assert sorted(out["coverage"]["unmatched"]) == sorted(MASKS)
    # allowed to have no partner, they are the user's choice: the comparison passes
    request = compare_request(traces["eager"], traces["sdpa"], None, None, None, allow_unmatched=["*attention_mask"])
    code = run_compare(services, request, True)
    out = json.loads(capsys.readouterr().out)
    assert code == 0, [p["name"] for p in out["pairs"] if p["status"] != "pass"]
    assert out["verdict"] == "no_divergence" and sorted(out["coverage"]["allowed_unmatched"]) == sorted(MASKS)
    assert out["first_divergence"] is None
    assert sorted(out["unmatched"]["a"]) == sorted(MASKS)
    assert out["unmatched"]["b"] == []
    assert {p["strategy"] for p in out["pairs"]} == {"name"}
    first = out["pairs"][0]
    assert (first["name"], first["module_path"], first["place"]) == (
        f"{MODEL_CLASS}_inputs_args_0",
        MODEL_CLASS,
        "inputs_args_0",
    )
    # the root's logits are in no JSON node but on disk: ingested, and last in call order
    assert out["pairs"][-1]["name"] == f"{MODEL_CLASS}_outputs_logits"
    assert all(p["stats"]["max_abs_diff"] <= 1e-5 for p in out["pairs"])
    assert len(out["pairs"]) == len(list(traces["sdpa"].glob("*.safetensors")))


def test_a_perturbed_mlp_weight_is_the_first_divergence_and_the_top_culprit(
    services: Services, traces: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = compare(services, capsys, traces["eager"], traces["perturbed"])
    assert code == 1
    assert isinstance(out["first_divergence"].pop("where"), list)  # a failing pair's: where it is confined
    assert out["first_divergence"] == {
        "name": f"{DOWN_PROJ}_outputs",
        "layer": 1,
        "stage": None,
        "unmatched_before": [],
        "basis": None,  # judged on element values, not on summaries
        "summary_reason": None,
        "candidate_only_before": [],
        "first_changed": None,
        "in_execution_order": True,
        "first_changed_on_summaries": False,
        "source_note": None,  # an output's: no source line is expected
        "crossed_before": [],
        "lowered_first": None,
        "candidate_early_before": [],
        "candidate_holds": None,
        # its module's weight perturbed: which only find_divergence can check (it holds the models)
        "find_divergence_checks": ["parameters and buffers"],
        "outputs_agree": False,
        "order_note": None,
        "paired_by": None,
        "candidate_name": None,
        "not_compared_before": [],
        "statistics_before": 0,
    }
    assert (out["basis"], out["pairs_on_summaries"], out["next_capture"]) == ("values", 0, None)
    top = out["culprits"][0]
    assert top["module_path"] == DOWN_PROJ
    assert top["input_error"] == 0 and top["added_error"] == top["output_error"] > 0.1
    assert all(c["added_error"] < top["added_error"] for c in out["culprits"][1:])
    names = [p["name"] for p in out["pairs"]]
    first = names.index(f"{DOWN_PROJ}_outputs")
    assert all(p["status"] == "pass" for p in out["pairs"][:first])
    # the human table names it too
    code = run_compare(services, compare_request(traces["eager"], traces["perturbed"], "table", None, None), False)
    text = capsys.readouterr().out
    assert code == 1
    assert f"CULPRIT: {DOWN_PROJ} added" in text
    assert f"FIRST DIVERGENCE: {DOWN_PROJ}_outputs (layer 1)" in text


def test_calls_are_in_tree_order_and_pruned_layers_come_back(services: Services, traces: dict[str, Path]) -> None:
    folder = traces["four_layers"]
    tree = json.loads(next(folder.glob("*_FULL_TENSORS.json")).read_text())
    model = next(c for c in tree["children"] if c["module_path"] == f"{MODEL_CLASS}.model")
    layers = [c["module_path"].rsplit(".", 1)[1] for c in model["children"] if ".layers." in c["module_path"]]
    assert layers == ["0", "3"]  # the debugger dropped layers 1 and 2 from its JSON (their files stay)
    result = services.ingestor.ingest("four", "ref", [InputFile(folder, "four_layers")])
    assert result.problems == [] and result.tensors == len(list(folder.glob("*.safetensors")))
    with services.sessions() as db:
        rows = db.scalars(
            select(TensorRecord).where(TensorRecord.run_id == result.run_id).order_by(TensorRecord.position)
        ).all()
        run = db.get_one(RunRecord, result.run_id)
        layer_of = [t.layer for t in rows if t.layer is not None]
        assert layer_of == sorted(layer_of) and set(layer_of) == {0, 1, 2, 3}
        down = [
            t.name for t in rows if t.module_path and t.module_path.endswith("mlp.down_proj") and t.place == "outputs"
        ]
        assert down == [f"{MODEL_CLASS}.model.layers.{n}.mlp.down_proj_outputs" for n in range(4)]
        assert rows[-1].name == f"{MODEL_CLASS}_outputs_logits"
        assert all(t.key_path == [] for t in rows)  # the one "data" key of each file is not part of the name
        assert run.module_tree is not None and run.module_tree["source"] == "hf-trace"
        blocks = run.module_tree["roots"][0]["children"][0]["children"]
        assert [b["path"].rsplit(".", 1)[1] for b in blocks if ".layers." in b["path"]] == ["0", "1", "2", "3"]


def test_an_archive_of_a_trace_reads_like_the_folder(
    services: Services, traces: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    archive = make_tar(traces["perturbed"], tmp_path / "perturbed.tar.gz", "w:gz", prefix="trace/")
    code, out = compare(services, capsys, traces["eager"], archive)
    assert code == 1 and out["culprits"][0]["module_path"] == DOWN_PROJ
    assert out["unmatched"] == {"a": [], "b": []}


def test_use_repr_traces_compare_summaries_and_say_values_are_missing(
    services: Services, traces: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = compare(services, capsys, traces["repr"], traces["repr"])
    assert code == 0
    assert out["pairs"] and all(p["summary"] and p["summary"]["has_values"] is False for p in out["pairs"])
    assert all(p["stats"] is None for p in out["pairs"])
    code, out = compare(services, capsys, traces["repr"], traces["repr_perturbed"])
    assert code == 1
    assert out["first_divergence"]["name"] == f"{DOWN_PROJ}_outputs"
    failing = next(p for p in out["pairs"] if p["name"] == f"{DOWN_PROJ}_outputs")
    assert {c["name"]: c["ok"] for c in failing["summary"]["checks"]}["std"] is False
    assert out["culprits"] == []  # no element values: no relative RMSE to rank modules by
    run_compare(services, compare_request(traces["repr"], traces["repr_perturbed"], "repr table", None, None), False)
    assert "element values are not available for" in capsys.readouterr().out


def test_api_upload_of_loose_trace_files_and_values_unavailable(
    shared_server: LiveServer, traces: dict[str, Path]
) -> None:
    """The browser's upload of a folder's files: the JSON among them makes them one trace."""

    def files(label: str, folder: Path) -> list[tuple[str, tuple[str, bytes]]]:
        return [(label, (p.name, p.read_bytes())) for p in sorted(folder.iterdir())]

    with httpx.Client(base_url=shared_server.url, timeout=120) as client:
        created = client.post(
            "/api/sessions",
            data={"name": "repr"},
            files=files("reference", traces["repr"]) + files("candidate", traces["repr_perturbed"]),
        )
        assert created.status_code == 201, created.text
        assert all(r["problems"] == [] for r in created.json()["runs"])
        session_id = created.json()["session"]["id"]
        report = client.get(f"/api/sessions/{session_id}/pairs").json()
        assert report["first_divergence"]["name"] == f"{DOWN_PROJ}_outputs"
        assert report["modules"]["has_values"] is False
        pair_id = report["first_divergence"]["pair_id"]
        refused = client.get(f"/api/pairs/{pair_id}/slice")
        assert refused.status_code == 400
        assert "element values are not available" in refused.json()["detail"]
        page = client.get(f"/pairs/{pair_id}")
        assert page.status_code == 200 and "Element values are not available" in page.text
        session_page = client.get(f"/sessions/{session_id}").text
        assert 'id="statistics-before"' in session_page and "compared on printed statistics only" in session_page
        same = client.post(
            "/api/sessions",
            data={"name": "repr alike"},
            files=files("reference", traces["repr"]) + files("candidate", traces["repr"]),
        )
        assert same.status_code == 201, same.text
        alike = same.json()["session"]["id"]
        judged = client.get(f"/api/sessions/{alike}/pairs").json()
        assert judged["verdict"] == "no_divergence", judged["verdict"]
        # a pass on printed statistics is no verified pass: no green banner, and what it rests on said
        alike_page = client.get(f"/sessions/{alike}").text
        assert 'class="banner pass"' not in alike_page and 'id="rests-on-statistics"' in alike_page, alike_page


def test_a_broken_trace_json_is_named_with_its_reason(
    services: Services, traces: dict[str, Path], tmp_path: Path
) -> None:
    folder = tmp_path / "broken"
    shutil.copytree(traces["eager"], folder)
    next(folder.glob("*_FULL_TENSORS.json")).write_text("{not json")
    result = services.ingestor.ingest("broken", "ref", [InputFile(folder, "broken")])
    reasons = {p.file: p.reason for p in result.problems}
    assert any(f.endswith("_FULL_TENSORS.json") and "not a valid trace JSON" in r for f, r in reasons.items())


def test_a_pass_on_printed_statistics_is_said_as_one(
    services: Services, traces: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """A use_repr=True trace keeps the mean, std, min and max of each tensor to 5 digits: a bug smaller than that
    passed with `basis: "values"` and "no divergence: 70 of 70 pairs pass", read as a verified pass. Its basis, its
    count and its words say what it rests on; the exit code stays 0, as a pass on a capture's summaries does (no pair
    is outside tolerance on what was compared; the words and `basis` say that was the printed statistics only)."""
    code, out = compare(services, capsys, traces["repr"], traces["repr"])
    assert code == 0 and out["verdict"] == "no_divergence"
    assert out["basis"] == "statistics" and out["pairs_on_statistics"] == len(out["pairs"]) > 0
    assert out["pairs_on_summaries"] == 0
    run_compare(services, compare_request(traces["repr"], traces["repr"], "repr words", None, None), False)
    lines = capsys.readouterr().out.splitlines()
    assert (
        f"no divergence found in the printed statistics: {len(out['pairs'])} of {len(out['pairs'])} pairs pass ("
        in ("\n".join(lines))
    )
    assert not any(line.startswith("no divergence:") for line in lines), lines
    assert "NO DIFFERENCE FOUND (statistics)" in lines[1], lines[1]


def test_a_first_divergence_after_passes_on_printed_statistics_says_where_it_may_have_begun(
    services: Services, traces: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """The pairs before a use_repr trace's first divergence passed on printed statistics only: the bug may be in one
    of them, below the digits printed (o_proj's output passed there, and the divergence was named after it)."""
    code, out = compare(services, capsys, traces["repr"], traces["repr_perturbed"])
    assert code == 1
    first = out["first_divergence"]
    names = [p["name"] for p in out["pairs"]]
    before = names[: names.index(first["name"])]
    assert first["statistics_before"] == len(before) > 0, first
    run_compare(services, compare_request(traces["repr"], traces["repr_perturbed"], "repr before", None, None), False)
    text = capsys.readouterr().out
    assert f"{len(before)} pairs before it were compared on printed statistics only, and passed there" in text, text
