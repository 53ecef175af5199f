"""Coverage-aware verdicts through `tensor-debugger compare A B`: a reference tensor with no partner in the candidate
makes the comparison incomplete (exit 1) unless the user allowed it; the first divergence names the reference
tensors before it that were never compared; a pair whose comparison failed never counts as compared or passing.
Runs are folders of `.pth` files written by torch.save."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from sqlalchemy import select
from tensor_debugger.compare.planning.plan import plan_session
from tensor_debugger.compare.reports.coverage import SessionVerdict
from tensor_debugger.compare.reports.pair_reports import session_pairs
from tensor_debugger.compare.reports.session_diff import Change, diff_sessions, find_session
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.services import Services
from tensor_debugger.store import catalog
from tensor_debugger.store.layout import read_layout
from tensor_debugger.store.models import TensorRecord

from tests.support.cli_main import CliResult, main_cli
from tests.support.dumps import layered_dump
from tests.support.servers import LiveServer

MISSING = ["1_attn", "1_mlp", "2_attn", "2_mlp", "3_attn", "3_mlp"]


def only_layer_zero(folder: Path) -> Path:
    """The candidate of a port that dumped only layer 0 (2 of the reference's 8 tensors)."""
    for f in folder.iterdir():
        if not f.name.startswith("0_"):
            f.unlink()
    return folder


def dumped_heads_first(folder: Path, name: str, new_name: str) -> None:
    """The port dumped `name` transposed under a name of its own: no pairing strategy pairs it (not even a shape
    unique on both sides)."""
    tensor = torch.load(folder / f"{name}.pth", weights_only=True)
    (folder / f"{name}.pth").unlink()
    torch.save(tensor.t().contiguous(), folder / f"{new_name}.pth")


def compare(tmp_path: Path, a: Path, b: Path, *options: str) -> tuple[CliResult, dict[str, Any]]:
    env = {"TENSOR_DEBUGGER_DATA_DIR": str(tmp_path / "data")}
    done = main_cli("compare", str(a), str(b), "--in-process", "--json", *options, env=env)
    return done, json.loads(done.stdout)


def test_a_candidate_that_dumped_only_layer_zero_is_incomplete(tmp_path: Path) -> None:
    a = layered_dump(tmp_path / "ref", None)
    b = only_layer_zero(layered_dump(tmp_path / "cand", None))
    done, out = compare(tmp_path, a, b)
    assert done.returncode == 1, done.stdout
    assert {p["status"] for p in out["pairs"]} == {"pass"} and len(out["pairs"]) == 2  # what was compared passes
    assert out["verdict"] == "incomplete"
    assert out["coverage"] == {
        "reference_tensors": 8,
        "compared": 2,
        "unmatched": MISSING,
        "allowed_unmatched": [],
        "not_compared": [],
        "runs_not_compared": [],
        "runs": [{"run": "cand", "against": "ref", "tensors": 8, "compared": 2, "not_asked": 0}],
        "out_of_step": [],
    }
    assert out["unmatched"] == {"a": MISSING, "b": []}  # the key scripts already read, as it was
    assert out["first_divergence"] is None
    table = main_cli("compare", str(a), str(b), "--in-process", env={"TENSOR_DEBUGGER_DATA_DIR": str(tmp_path / "d")})
    assert table.returncode == 1
    assert "no divergence among the pairs compared: 2 of 2 pairs pass" in table.stdout
    assert (
        "NOT COMPARED: 6 of 8 reference tensors have no partner in the candidate: 1_attn, 1_mlp, 2_attn, 2_mlp, "
        "3_attn, 3_mlp" in table.stdout
    )


def test_allow_unmatched_globs_make_the_missing_tensors_the_users_choice(tmp_path: Path) -> None:
    a = layered_dump(tmp_path / "ref", None)
    b = only_layer_zero(layered_dump(tmp_path / "cand", None))
    done, out = compare(tmp_path, a, b, "--allow-unmatched", "[12]_*", "--allow-unmatched", "3_*")
    assert done.returncode == 0, done.stdout
    assert out["verdict"] == "no_divergence"
    assert out["coverage"]["unmatched"] == [] and out["coverage"]["allowed_unmatched"] == MISSING
    # a glob that leaves one out: that one alone keeps the comparison incomplete
    done, out = compare(tmp_path, a, b, "--allow-unmatched", "[12]_*", "--allow-unmatched", "3_attn")
    assert done.returncode == 1 and out["verdict"] == "incomplete"
    assert out["coverage"]["unmatched"] == ["3_mlp"]


def test_a_pairing_files_unpaired_entries_allow_what_they_name(tmp_path: Path) -> None:
    a = layered_dump(tmp_path / "ref", None)
    b = only_layer_zero(layered_dump(tmp_path / "cand", None))
    pairing = tmp_path / "pairing.json"
    pairing.write_text(json.dumps({"unpaired": [{"a": name} for name in MISSING[:4]]}))
    done, out = compare(tmp_path, a, b, "--pairing", str(pairing))
    assert done.returncode == 1 and out["verdict"] == "incomplete"
    assert out["coverage"]["unmatched"] == ["3_attn", "3_mlp"]
    assert out["coverage"]["allowed_unmatched"] == MISSING[:4]
    pairing.write_text(json.dumps({"unpaired": [{"a": name} for name in MISSING]}))
    done, out = compare(tmp_path, a, b, "--pairing", str(pairing))
    assert done.returncode == 0 and out["verdict"] == "no_divergence", done.stdout


def test_a_two_name_refusal_of_the_failing_pairs_leaves_the_session_incomplete(tmp_path: Path) -> None:
    """`{"a", "b"}` in a pairing file's `unpaired` says "never these two", not "this tensor may go uncompared":
    refusing the pairs that diverge leaves their reference tensors unmatched (exit 1), never a pass."""
    a = layered_dump(tmp_path / "ref", None)
    b = layered_dump(tmp_path / "cand", bug_from=3)
    done, out = compare(tmp_path, a, b)
    assert done.returncode == 1 and out["verdict"] == "diverged" and out["first_divergence"]["name"] == "3_attn"
    pairing = tmp_path / "pairing.json"
    pairing.write_text(json.dumps({"unpaired": [{"a": name, "b": name} for name in ("3_attn", "3_mlp")]}))
    done, out = compare(tmp_path, a, b, "--pairing", str(pairing))
    assert done.returncode == 1, done.stdout
    assert out["verdict"] == "incomplete" and out["first_divergence"] is None
    assert out["coverage"]["unmatched"] == ["3_attn", "3_mlp"] and out["coverage"]["allowed_unmatched"] == []
    assert out["unmatched"] == {"a": ["3_attn", "3_mlp"], "b": ["3_attn", "3_mlp"]}
    table = main_cli(
        "compare", str(a), str(b), "--in-process", "--pairing", str(pairing),
        env={"TENSOR_DEBUGGER_DATA_DIR": str(tmp_path / "d")},
    )  # fmt: skip
    assert table.returncode == 1 and "no divergence among the pairs compared: 6 of 6 pairs pass" in table.stdout
    assert "NOT COMPARED: 2 of 8 reference tensors have no partner in the candidate: 3_attn, 3_mlp" in table.stdout
    # one-sided, the same tensors are the user's choice
    pairing.write_text(json.dumps({"unpaired": [{"a": name} for name in ("3_attn", "3_mlp")]}))
    done, out = compare(tmp_path, a, b, "--pairing", str(pairing))
    assert done.returncode == 0 and out["verdict"] == "no_divergence", done.stdout
    assert out["coverage"]["allowed_unmatched"] == ["3_attn", "3_mlp"]


def test_the_first_divergence_names_the_reference_tensors_before_it_never_compared(tmp_path: Path) -> None:
    """The port dumped 1_attn under its own name (no strategy pairs it) and diverges from layer 2 on."""
    a = layered_dump(tmp_path / "ref", None)
    b = layered_dump(tmp_path / "cand", bug_from=2)
    dumped_heads_first(b, "1_attn", "heads_first_attention")
    done, out = compare(tmp_path, a, b)
    assert done.returncode == 1
    assert out["verdict"] == "diverged"
    assert out["first_divergence"]["name"] == "2_attn"
    assert out["first_divergence"]["unmatched_before"] == ["1_attn"]
    assert out["first_divergences"]["cand"]["unmatched_before"] == ["1_attn"]
    assert out["coverage"]["unmatched"] == ["1_attn"] and out["unmatched"]["b"] == ["heads_first_attention"]
    table = main_cli("compare", str(a), str(b), "--in-process", env={"TENSOR_DEBUGGER_DATA_DIR": str(tmp_path / "d")})
    lines = table.stdout.splitlines()
    first = next(n for n, line in enumerate(lines) if line.startswith("FIRST DIVERGENCE: 2_attn"))
    assert lines[first + 1] == "1 reference tensor before it was not compared (no partner in the candidate): 1_attn"
    # allowed by the user, it is no longer named
    done, out = compare(tmp_path, a, b, "--allow-unmatched", "1_attn")
    assert out["first_divergence"]["unmatched_before"] == [] and out["coverage"]["allowed_unmatched"] == ["1_attn"]
    # after the divergence, a tensor without partner is not "before it"
    c = layered_dump(tmp_path / "late", bug_from=1)
    dumped_heads_first(c, "3_mlp", "something_else")
    done, out = compare(tmp_path, a, c)
    assert out["first_divergence"]["name"] == "1_attn" and out["first_divergence"]["unmatched_before"] == []
    assert out["coverage"]["unmatched"] == ["3_mlp"]


def test_a_pair_whose_comparison_failed_is_never_counted_as_compared(tmp_path: Path, services: Services) -> None:
    """A chunk of a stored array broken after ingest: its pair errors, and the session does not pass; beside a
    session where that pair passed, compare-sessions does not call it "same"."""
    a = layered_dump(tmp_path / "ref", None)
    for label, folder in (("reference", a), ("candidate", layered_dump(tmp_path / "same", None))):
        good = services.ingestor.ingest("all good", label, [InputFile(folder, str(folder))]).session_id
    plan_session(services.context, good)
    services.compute(good)
    # within tolerance of the reference, but not bit-identical: arrays of its own
    b = layered_dump(tmp_path / "cand", None, noise=1e-7, seed=3)
    for label, folder in (("reference", a), ("candidate", b)):
        result = services.ingestor.ingest("broken chunk", label, [InputFile(folder, str(folder))])
    session_id = result.session_id
    with services.sessions() as db:
        key = db.scalar(
            select(TensorRecord.store_key).where(TensorRecord.run_id == result.run_id, TensorRecord.name == "2_mlp")
        )
    assert key is not None
    root = Path(services.store.url.removeprefix("file://"))
    chunk = root / key / read_layout(root / key, key).chunk_key((0, 0))
    chunk.write_bytes(b"not a blosc frame" * 8)
    plan_session(services.context, session_id)
    services.compute(session_id)
    with services.sessions() as db:
        report = session_pairs(db, session_id)
        summary = catalog.summarize_sessions(db, [session_id])[session_id]
    statuses = {p.name: str(p.status) for p in report.pairs}
    assert statuses["2_mlp"] == "error" and {s for n, s in statuses.items() if n != "2_mlp"} == {"pass"}
    assert report.verdict == SessionVerdict.INCOMPLETE
    assert report.coverage.compared == 7 and report.coverage.not_compared == ["2_mlp"]
    assert report.progress.errors == 1 and report.first_divergence is None
    assert summary.not_compared == 1 and summary.failing == 0  # the sessions list: not "none" failing
    with services.sessions() as db:
        diff = diff_sessions(db, find_session(db, "all good"), session_id)
    assert good == diff.a.id
    assert diff.a.verdict == SessionVerdict.NO_DIVERGENCE and diff.b.verdict == SessionVerdict.INCOMPLETE
    assert {p.key: p.change for p in diff.pairs}["2_mlp"] == Change.NOT_COMPARED
    assert diff.counts[Change.NOT_COMPARED] == 1 and diff.pending and not diff.broke  # exit 2: cannot all be said


def test_compare_sessions_says_a_session_left_reference_tensors_out(tmp_path: Path) -> None:
    """S1 compares every tensor; S2's candidate dumped only layer 0: not "no divergence"."""
    a = layered_dump(tmp_path / "ref", None)
    full = layered_dump(tmp_path / "full", None)
    short = only_layer_zero(layered_dump(tmp_path / "short", None))
    env = {"TENSOR_DEBUGGER_DATA_DIR": str(tmp_path / "data")}
    for name, b in (("all", full), ("layer zero", short)):
        main_cli("compare", str(a), str(b), "--in-process", "--name", name, "--json", env=env)
    done = main_cli("compare-sessions", "all", "layer zero", "--json", env=env)
    assert done.returncode == 2  # 6 pairs of S1 not compared in S2: whether the change broke them is not known
    out = json.loads(done.stdout)
    assert out["a"]["verdict"] == "no_divergence" and out["b"]["verdict"] == "incomplete"
    assert out["b"]["coverage"]["unmatched"] == MISSING and out["counts"]["only in A"] == 6
    table = main_cli("compare-sessions", "all", "layer zero", env=env)
    assert "A: all (session 1): no divergence" in table.stdout
    assert (
        "B: layer zero (session 2): no divergence among the pairs compared, but INCOMPLETE: 6 reference tensors have "
        "no partner (1_attn, 1_mlp, 2_attn, 2_mlp, 3_attn, …)" in table.stdout
    )


def test_allow_unmatched_reaches_a_running_server(shared_server: LiveServer, tmp_path: Path) -> None:
    """`compare` handed to the server on its data dir (the warm path) takes --allow-unmatched along."""
    a = layered_dump(tmp_path / "ref", None)
    b = only_layer_zero(layered_dump(tmp_path / "cand", None))
    data = str(shared_server.data_dir)
    done = main_cli("--data-dir", data, "compare", str(a), str(b), "--name", f"warm {tmp_path.name}", "--json")
    assert done.returncode == 1 and json.loads(done.stdout)["coverage"]["unmatched"] == MISSING
    done = main_cli(
        "--data-dir", data, "compare", str(a), str(b), "--allow-unmatched", "[1-3]_*", "--json", "--name", "warm 2"
    )
    out = json.loads(done.stdout)
    assert done.returncode == 0 and out["coverage"]["allowed_unmatched"] == MISSING, done.stdout
    assert out["session"]["url"].startswith(shared_server.url)  # the server did the work


def test_one_reference_tensor_without_partner_is_counted_in_words_that_agree(tmp_path: Path) -> None:
    """One of 8 reference tensors has no partner: "1 of 8 reference tensors has", not "1 of 8 reference tensor"."""
    a = layered_dump(tmp_path / "ref", None)
    b = layered_dump(tmp_path / "cand", None)
    (b / "3_mlp.pth").unlink()
    table = main_cli("compare", str(a), str(b), "--in-process", env={"TENSOR_DEBUGGER_DATA_DIR": str(tmp_path / "d")})
    assert table.returncode == 1, table.stdout + table.stderr
    assert "NOT COMPARED: 1 of 8 reference tensors has no partner in the candidate: 3_mlp" in table.stdout


def test_empty_tensors_pass_only_where_their_shapes_agree(tmp_path: Path) -> None:
    """An expert given no token: `[0, 8]` against `[0, 8]` passes with 0 elements (no mean, no cosine: null, not NaN
    or 1) and counts as compared (it agrees by holding nothing); against `[0, 4]` or `[8, 0]` it is incomparable,
    with the shapes said, never a pass by flattening or permuting nothing."""
    for name, shape in (("same", (0, 8)), ("narrower", (0, 4)), ("turned", (8, 0))):
        (tmp_path / name / "ref").mkdir(parents=True)
        (tmp_path / name / "cand").mkdir()
        torch.save(torch.zeros(0, 8), tmp_path / name / "ref" / "0_expert.pth")
        torch.save(torch.zeros(*shape), tmp_path / name / "cand" / "0_expert.pth")
    done, out = compare(tmp_path / "same", tmp_path / "same" / "ref", tmp_path / "same" / "cand")
    assert done.returncode == 0 and out["verdict"] == "no_divergence", done.stdout
    stats = out["pairs"][0]["stats"]
    assert out["pairs"][0]["status"] == "pass" and stats["numel"] == 0
    assert stats["cosine"] is None and stats["mean_abs_diff"] is None and stats["mse"] is None
    assert out["coverage"]["compared"] == 1
    for name, shapes in (("narrower", "[0, 8] vs [0, 4]"), ("turned", "[0, 8] vs [8, 0]")):
        done, out = compare(tmp_path / name, tmp_path / name / "ref", tmp_path / name / "cand")
        assert out["pairs"][0]["status"] == "incomparable", done.stdout
        assert out["pairs"][0]["alignment"] == f"incomparable: {shapes}"
        assert out["verdict"] != "no_divergence" and out["coverage"]["compared"] == 0
