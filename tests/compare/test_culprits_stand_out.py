"""A culprit is named only where its added error stands out, checked on real runs of a tiny Llama: fp32 against a
correct bf16 run (every stage rounds, no culprit) and against the same bf16 run with a 5% bug in one stage (that
stage named), as stage dumps, Hugging Face traces and captures, through `compare --json` and its table."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from tensor_debugger import capture
from tensor_debugger.compare.reports.compare_report import to_json
from tensor_debugger.compare.reports.contract import compare_report
from tensor_debugger.engine.culprits import stands_out
from tensor_debugger.settings import Settings

from tests.support.cli_main import main_cli
from tests.support.dumps import seeded
from tests.support.sessions import compared
from tests.support.stage_dumps import BUG_STAGE, dump_stages
from tests.support.traces import MODEL_CLASS, SCALED, WrittenTraces, input_ids, tiny_llama

BUG_MODULE = f"{MODEL_CLASS}.model.layers.1.self_attn.o_proj"


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("stage_dumps")
    return {
        "fp32": dump_stages(tiny_llama(), root / "fp32"),
        "bf16": dump_stages(tiny_llama(dtype=torch.bfloat16), root / "bf16"),
        "bf16_bug": dump_stages(tiny_llama(dtype=torch.bfloat16, scale=SCALED), root / "bf16_bug"),
    }


def compare_json(tmp_path: Path, a: Path, b: Path) -> tuple[int, dict[str, Any]]:
    done = main_cli("--data-dir", str(tmp_path / "data"), "compare", str(a), str(b), "--json")
    return done.returncode, json.loads(done.stdout)


def test_the_rule_on_its_own() -> None:
    even = [0.002, 0.001, -0.001, 0.003, 0.0005, 0.002]
    assert stands_out(even, [0.0, 0.002, 0.003, 0.002, 0.005, 0.005]) == [False] * 6
    bug = [*even[:3], 0.045, *even[4:]]
    assert stands_out(bug, [0.0, 0.002, 0.003, 0.004, 0.05, 0.05]) == [False, False, False, True, False, False]
    # an amplified error it was given is not one it created, however large
    assert stands_out([*even, 0.03], [0.0, 0.002, 0.003, 0.002, 0.005, 0.005, 0.05])[-1] is False
    # a NaN that appears stands out; fp32 rounding (below MIN_ADDED_ERROR) never does
    assert stands_out([0.001, math.inf, 0.001], [0.0, 0.001, 0.001]) == [False, True, False]
    assert stands_out([0.0, 0.0, 3e-6], [0.0, 0.0, 0.0]) == [False, False, False]
    # with a noise floor: against what the floor predicts there, not the median
    assert stands_out([0.01, 0.01], [0.0, 0.0], [0.01, 0.001], factor=4) == [False, True]


def test_stage_dumps_even_drift_names_no_culprit(tmp_path: Path, dumps: dict[str, Path]) -> None:
    code, out = compare_json(tmp_path, dumps["fp32"], dumps["bf16"])
    assert code == 1  # bf16 is outside fp32's tolerances everywhere...
    assert out["culprits"] == []  # ...but no stage stands out
    assert out["error_growth"] == "even" and "grows evenly" in out["culprit_note"]
    table = main_cli("--data-dir", str(tmp_path / "data"), "compare", str(dumps["fp32"]), str(dumps["bf16"]))
    assert "CULPRIT" not in table.stdout
    assert "The error grows evenly through the run: no stage stands out" in table.stdout


def test_stage_dumps_a_planted_bug_is_the_one_culprit(tmp_path: Path, dumps: dict[str, Path]) -> None:
    code, out = compare_json(tmp_path, dumps["fp32"], dumps["bf16_bug"])
    assert code == 1
    assert [c["name"] for c in out["culprits"]] == [BUG_STAGE]
    assert 0.03 < out["culprits"][0]["added_error"] < 0.06
    assert out["error_growth"] == "stands out" and out["culprit_note"] is None
    table = main_cli("--data-dir", str(tmp_path / "data"), "compare", str(dumps["fp32"]), str(dumps["bf16_bug"]))
    assert f"CULPRIT: {BUG_STAGE} added" in table.stdout and "grows evenly" not in table.stdout


def test_traces_even_drift_names_no_module_not_even_the_root(tmp_path: Path, hf_traces: WrittenTraces) -> None:
    code, out = compare_json(tmp_path, hf_traces["eager"], hf_traces["bf16"])
    assert code == 1
    assert out["culprits"] == [] and out["error_growth"] == "even"
    assert "no module stands out" in out["culprit_note"]


def test_traces_a_planted_bug_names_its_module(tmp_path: Path, hf_traces: WrittenTraces) -> None:
    code, out = compare_json(tmp_path, hf_traces["eager"], hf_traces["bf16_bug"])
    assert code == 1
    assert [c["module_path"] for c in out["culprits"]] == [BUG_MODULE]
    table = main_cli(
        "--data-dir", str(tmp_path / "data"), "compare", str(hf_traces["eager"]), str(hf_traces["bf16_bug"])
    )
    assert f"CULPRIT: {BUG_MODULE} added" in table.stdout


def test_traces_say_where_a_block_records_too_little_to_name_a_module(tmp_path: Path, hf_traces: WrittenTraces) -> None:
    """A 5% bug in the attention block's own code, after the attention and before o_proj: no recorded module adds
    the error (o_proj's input already carries it), and the trace has no output of the block that would say more."""
    code, out = compare_json(tmp_path, hf_traces["eager"], hf_traces["bf16_inner_bug"])
    assert code == 1
    assert out["culprits"] == [] and out["error_growth"] == "stands out"
    block = f"{MODEL_CLASS}.model.layers.1.self_attn"
    assert out["culprit_note"] == (
        f"`{block}` records no output: the error appears between its q_proj, k_proj, v_proj and `o_proj`"
    )
    table = main_cli(
        "--data-dir", str(tmp_path / "data"), "compare", str(hf_traces["eager"]), str(hf_traces["bf16_inner_bug"])
    )
    assert f"`{block}` records no output" in table.stdout and "CULPRIT" not in table.stdout


def captured_json(settings: Settings, candidate: Any) -> dict[str, Any]:
    """A capture of the fp32 model and one of `candidate` into one session, compared, as `compare --json` says it."""
    session = f"captured {id(candidate)}"
    for model, run in ((tiny_llama(), "reference"), (candidate, "candidate")):
        with torch.no_grad(), capture(model, session=session, run=run, data_dir=settings.data_dir) as result:
            model(input_ids())
    assert result.session_id is not None
    report = compared(settings, result.session_id, modules=True)
    return to_json(compare_report(result.session_id, session, "", report, []))


def test_captures_even_drift_and_a_planted_bug(settings: Settings) -> None:
    even = captured_json(settings, tiny_llama(dtype=torch.bfloat16))
    assert even["culprits"] == [] and even["error_growth"] == "even"
    bug = captured_json(settings, tiny_llama(dtype=torch.bfloat16, scale=SCALED))
    assert [c["module_path"] for c in bug["culprits"]] == [BUG_MODULE]


def test_with_a_noise_floor_a_culprit_stands_out_from_what_the_floor_predicts(tmp_path: Path) -> None:
    """Every stage of the rerun and of the candidate carries about 1% error (not accumulated): alone, the first
    stage's 1% would stand out against the ~0 the others add, but its input was not compared, so it is said in
    words, not named; the floor predicts it, and only the stage whose 10% is far beyond the floor's 1% there is
    named."""
    folders = {side: tmp_path / side for side in ("ref", "rerun", "cand")}
    for folder in folders.values():
        folder.mkdir()
    stages = ["0_query", "0_key", "0_value", "0_post_attn", "1_query", "1_key", "1_value", "1_post_attn"]
    for n, name in enumerate(stages):
        a = seeded((32, 64), n)
        torch.save(a, folders["ref"] / f"{name}.pth")
        for side, seed, error in (("rerun", 100, 0.01), ("cand", 200, 0.1 if name == "1_value" else 0.01)):
            noise = seeded((32, 64), seed + n)
            torch.save(a + noise * (error * a.norm() / noise.norm()), folders[side] / f"{name}.pth")
    without = compare_json(tmp_path / "without", folders["ref"], folders["cand"])[1]
    assert [c["name"] for c in without["culprits"]] == ["1_value"]
    assert without["culprit_note"].startswith("the error is already there at 0_query (the first tensor compared")
    done = main_cli(
        "--data-dir", str(tmp_path / "data"), "compare", str(folders["ref"]), str(folders["cand"]),
        "--noise", str(folders["rerun"]), "--json",
    )  # fmt: skip
    assert [c["name"] for c in json.loads(done.stdout)["culprits"]] == ["1_value"]


def test_a_stage_after_integer_and_bool_pairs_is_not_called_the_first_tensor_compared(tmp_path: Path) -> None:
    """0_query (int32) and 0_key (bool) are compared, not ranked; 0_value (float, 1% off) is the first ranked stage:
    the note says it is the first that carries activations, not the first tensor compared."""
    torch.manual_seed(0)
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
        torch.save(torch.tensor([1, 2, 3], dtype=torch.int32), tmp_path / run / "0_query.pth")
        torch.save(torch.tensor([True, False]), tmp_path / run / "0_key.pth")
    value = torch.randn(8, 16)
    for run, scale in (("a", 1.0), ("b", 1.01)):
        torch.save(value * scale, tmp_path / run / "0_value.pth")
        for n, stage in enumerate(("1_query", "1_key", "1_value", "2_query", "2_key")):  # carrying it, adding none
            torch.save(value * scale * (n + 2), tmp_path / run / f"{stage}.pth")
    done = main_cli("--data-dir", str(tmp_path / "data"), "compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json")
    assert done.returncode == 1, done.stderr
    note = json.loads(done.stdout)["culprit_note"]
    assert note.startswith(
        "the error is already there at 0_value (the first tensor compared that carries activations: the integer, "
        "bool, weight or scalar pairs compared before it are not ranked; "
    ), note
