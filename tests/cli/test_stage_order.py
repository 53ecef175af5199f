"""A dump's `{layer}_{stage}` names give execution order only for the stages of the transformer stage order
(engine/stages.py's STAGE_ORDER, the README's naming, and its aliases, a Llama layer's module names): others
(`attn_scores`, `rotary_cos`) are sorted by name. Where
the failing stages of a layer have no known order, no failing pair is called first and no stage of that layer is
named a culprit. A pair whose partner was guessed (by shape, by a fuzzy name) is named as a guess wherever it is the
first divergence or a culprit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from tensor_debugger.compare.reports.guessed_pairs import GUESSING
from tensor_debugger.store.reports import PairingStrategy

from tests.support import loopback_http
from tests.support.cli_main import main_cli
from tests.support.dumps import layered_dump
from tests.support.servers import LiveServer

LLAMA_STAGES = ("input_layernorm", "q_proj", "k_proj", "v_proj", "o_proj", "post_attention_layernorm", "mlp")


def dumps(root: Path, reference: dict[str, NDArray[Any]], candidate: dict[str, NDArray[Any]]) -> tuple[Path, Path]:
    for side, tensors in (("a", reference), ("b", candidate)):
        (root / side).mkdir()
        for name, value in tensors.items():
            np.save(root / side / f"{name}.npy", value)
    return root / "a", root / "b"


def llama_named(root: Path) -> tuple[Path, Path]:
    """Layer 1's o_proj 5% off, and the stages after it 30% (as a bug in o_proj carries on): by name, `mlp` sorts
    first, but o_proj ran first."""
    rng = np.random.default_rng(2)
    reference = {f"{n}_{s}": rng.standard_normal((8, 16)).astype(np.float32) for n in range(2) for s in LLAMA_STAGES}
    candidate = dict(reference)
    candidate["1_o_proj"] = reference["1_o_proj"] * np.float32(1.05)
    for stage in ("post_attention_layernorm", "mlp"):
        candidate[f"1_{stage}"] = reference[f"1_{stage}"] * np.float32(1.3)
    return dumps(root, reference, candidate)


def compare_json(data: Path, a: Path, b: Path) -> dict[str, object]:
    done = main_cli("--data-dir", str(data), "compare", str(a), str(b), "--json")
    assert done.returncode == 1, done.stderr
    out: dict[str, object] = json.loads(done.stdout)
    return out


def test_hugging_face_module_names_are_in_execution_order(tmp_path: Path) -> None:
    """By name `mlp` sorts before `o_proj`; as a Llama layer's modules (STAGE_ALIASES), o_proj runs first."""
    a, b = llama_named(tmp_path)
    out = compare_json(tmp_path / "data", a, b)
    first = out["first_divergence"]
    assert isinstance(first, dict)
    assert first["name"] == "1_o_proj" and first["in_execution_order"] is True and first["order_note"] is None
    pairs = out["pairs"]
    assert isinstance(pairs, list)
    assert [p["name"] for p in pairs[7:]] == [f"1_{s}" for s in LLAMA_STAGES]
    culprits = out["culprits"]
    assert isinstance(culprits, list)
    assert {c["name"]: c["previous"] for c in culprits}["1_post_attention_layernorm"] == "1_o_proj"


def with_scores(root: Path) -> tuple[Path, Path]:
    """The README's stages, and `attn_scores` and `attn_probs`, in no known order: sorted after `post_mlp` by name,
    they may have run before `post_attn`. Each from `attn_scores` on is 10% off."""
    rng = np.random.default_rng(3)
    stages = ("post_ln_pre_attn", "query", "key", "value", "attn_scores", "attn_probs", "post_attn", "post_mlp")
    reference = {f"0_{s}": rng.standard_normal((4, 8)).astype(np.float32) for s in stages}
    candidate = {k: v * np.float32(1.1) if k[2:] in stages[4:] else v for k, v in reference.items()}
    return dumps(root, reference, candidate)


def test_stages_outside_the_known_order_are_not_called_first_nor_a_culprit(tmp_path: Path) -> None:
    a, b = with_scores(tmp_path)
    out = compare_json(tmp_path / "data", a, b)
    first = out["first_divergence"]
    assert isinstance(first, dict)
    assert first["name"] == "0_post_attn" and first["in_execution_order"] is False
    assert first["order_note"] == (
        "layer 0's stages attn_probs and attn_scores are not in the transformer stage order, so their place among "
        "the layer's stages is not known (stages are listed by name)"
    )
    assert first["unmatched_before"] == [] and first["first_changed"] is None
    assert out["culprits"] == []
    assert str(out["culprit_note"]).startswith("no stage of layer 0 is named a culprit: layer 0's stages")
    table = main_cli("--data-dir", str(tmp_path / "data"), "compare", str(a), str(b)).stdout
    assert "FIRST DIVERGENCE" not in table and "CULPRIT" not in table
    assert "DIVERGENCE (no execution order is known: layer 0's stages attn_probs and attn_scores are" in table
    assert "the first failing pair listed, not the first to fail): 0_post_attn (layer 0, stage post_attn)" in table


def test_two_names_of_one_stage_have_no_order(tmp_path: Path) -> None:
    """`o_proj` is another name of `post_attn_pre_resid`: a dump holding both does not say which ran first."""
    rng = np.random.default_rng(7)
    reference = {f"0_{s}": rng.standard_normal((4, 8)).astype(np.float32) for s in ("o_proj", "post_attn_pre_resid")}
    candidate = {k: v + np.float32(1) for k, v in reference.items()}
    out = compare_json(tmp_path / "data", *dumps(tmp_path, reference, candidate))
    first = out["first_divergence"]
    assert isinstance(first, dict) and first["in_execution_order"] is False
    assert first["order_note"] == (
        "layer 0's stages o_proj, post_attn_pre_resid name one place in the transformer stage order, so which ran "
        "first is not known"
    )


def test_a_block_name_beside_stages_inside_its_block_has_no_order(tmp_path: Path) -> None:
    """`0_attn` names the whole attention block: here (as some name it) its input, which the bug changed, beside
    `0_query` and `0_key` computed from it. Sorted at the block's output it lists last; its place is not known, so
    no failing pair is called first, and none is said to be the first tensor compared."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    w = rng.standard_normal((8, 8)).astype(np.float32)
    changed = x.copy()
    changed[0, 0] += 0.5
    reference, candidate = ({"0_attn": v, "0_query": v @ w, "0_key": v @ w.T} for v in (x, changed))
    a, b = dumps(tmp_path, reference, candidate)
    out = compare_json(tmp_path / "data", a, b)
    first = out["first_divergence"]
    assert isinstance(first, dict) and first["in_execution_order"] is False
    assert first["order_note"] == (
        "layer 0's stage attn names the whole attention block (its input or its output) and the layer also holds "
        "key and query, inside that block, so which ran first is not known"
    )
    assert out["culprits"] == []
    table = main_cli("--data-dir", str(tmp_path / "data"), "compare", str(a), str(b)).stdout
    assert "FIRST DIVERGENCE" not in table and "what it was given was not compared" not in table


def test_block_names_alone_are_in_order(tmp_path: Path) -> None:
    """tests/support's layered_dump: `{layer}_attn` and `{layer}_mlp`, attention before MLP in every standard block:
    from layer 1 on 0.5 off, layer 1's attn is the first divergence, in execution order."""
    a = layered_dump(tmp_path / "a", None, layers=3)
    b = layered_dump(tmp_path / "b", 1, layers=3)
    out = compare_json(tmp_path / "data", a, b)
    first = out["first_divergence"]
    assert isinstance(first, dict)
    assert first["name"] == "1_attn" and first["in_execution_order"] is True and first["order_note"] is None
    pairs = out["pairs"]
    assert isinstance(pairs, list)
    assert [p["name"] for p in pairs] == [f"{n}_{s}" for n in range(3) for s in ("attn", "mlp")]


def test_one_failing_stage_of_unknown_order_in_its_layer_is_still_first(tmp_path: Path) -> None:
    """The order within a layer matters only among its failing stages: a layer's one failing stage, after layers that
    pass, is the first divergence whatever its name. A layer of one stage is in order, so its added error ranks;
    one that also holds `query` is not (is `hidden` before or after it?), so none of its stages is a culprit."""
    rng = np.random.default_rng(4)
    reference = {f"{n}_hidden": rng.standard_normal((4, 8)).astype(np.float32) for n in range(4)}
    candidate = dict(reference)
    for n in (2, 3):
        candidate[f"{n}_hidden"] = reference[f"{n}_hidden"] * np.float32(1.5)
    query = {"2_query": rng.standard_normal((4, 8)).astype(np.float32)}
    # within tolerance, but changed: listed before 2_hidden by name, not known to have run before it
    changed = {"2_query": query["2_query"] + np.float32(1e-6)}
    for folder, extra, theirs in (("alone", {}, {}), ("beside_query", query, changed)):
        (tmp_path / folder).mkdir()
        out = compare_json(tmp_path / folder / "data", *dumps(tmp_path / folder, reference | extra, candidate | theirs))
        first = out["first_divergence"]
        assert isinstance(first, dict)
        assert first["name"] == "2_hidden" and first["in_execution_order"] is True and first["order_note"] is None
        assert first["first_changed"] is None
        culprits = out["culprits"]
        assert isinstance(culprits, list)
        if extra:
            assert culprits == [] and str(out["culprit_note"]).startswith(
                "no stage of layer 2 is named a culprit: layer 2's stage hidden is not in the transformer stage order"
            )
        else:
            assert [c["name"] for c in culprits] == ["2_hidden"] and culprits[0]["paired_by"] is None


def test_the_first_changed_tensor_names_those_whose_order_against_it_is_not_known(tmp_path: Path) -> None:
    """Layer 0's `query` and `attn_in` both changed within tolerance, layer 1's `query` fails: `attn_in` is in no
    known stage order, so whether `query` changed first is not known. The answer named `0_query` alone as "the first
    tensor whose values differ at all"; it names both."""
    rng = np.random.default_rng(5)
    names = [f"{n}_{s}" for n in range(2) for s in ("attn_in", "query", "key")]
    reference = {name: rng.standard_normal((4, 8)).astype(np.float32) for name in names}
    candidate = dict(reference)
    for name in ("0_attn_in", "0_query"):
        candidate[name] = reference[name] + np.float32(1e-6)
    candidate["1_query"] = reference["1_query"] * np.float32(1.5)
    out = compare_json(tmp_path / "data", *dumps(tmp_path, reference, candidate))
    first = out["first_divergence"]
    assert isinstance(first, dict) and first["name"] == "1_query", first
    assert first["first_changed"] == "0_query or 0_attn_in (their order is not known)", first


def test_a_pair_guessed_by_shape_is_named_a_guess(tmp_path: Path) -> None:
    """The reference's `0_query` has no partner by name; the candidate's `0_rotary_cos`, of its shape, was paired by
    shape: a guess, which the first divergence says, with the candidate's tensor."""
    rng = np.random.default_rng(5)
    reference = {"0_post_ln_pre_attn": rng.standard_normal((4, 8)).astype(np.float32)}
    candidate = dict(reference)
    reference["0_query"] = rng.standard_normal((4, 16)).astype(np.float32)
    candidate["0_rotary_cos"] = rng.standard_normal((4, 16)).astype(np.float32)
    a, b = dumps(tmp_path, reference, candidate)
    out = compare_json(tmp_path / "data", a, b)
    first = out["first_divergence"]
    assert isinstance(first, dict)
    assert first["name"] == "0_query" and first["paired_by"] == "shape"
    assert first["candidate_name"] == "0_rotary_cos"
    table = main_cli("--data-dir", str(tmp_path / "data"), "compare", str(a), str(b)).stdout
    assert (
        "FIRST DIVERGENCE: 0_query (layer 0, stage query; paired by shape with the candidate's 0_rotary_cos: a guess)"
        in table
    )


def fuzzy_paired(root: Path) -> tuple[Path, Path]:
    """One tensor per layer; layer 2's names differ (`attn_logits`, `attn_logits_masked`), paired by fuzzy name, and
    the candidate's holds -inf where it masks."""
    rng = np.random.default_rng(6)
    reference = {f"{n}_hidden": rng.standard_normal((4, 4)).astype(np.float32) for n in range(2)}
    candidate = dict(reference)
    reference["2_attn_logits"] = rng.standard_normal((4, 4)).astype(np.float32)
    candidate["2_attn_logits_masked"] = np.where(np.tri(4, dtype=bool), reference["2_attn_logits"], -np.inf).astype(
        np.float32
    )
    reference["3_hidden"] = rng.standard_normal((4, 4)).astype(np.float32)
    candidate["3_hidden"] = reference["3_hidden"]
    return dumps(root, reference, candidate)


def test_a_fuzzy_pair_named_first_and_culprit_is_named_a_guess(tmp_path: Path) -> None:
    a, b = fuzzy_paired(tmp_path)
    out = compare_json(tmp_path / "data", a, b)
    first = out["first_divergence"]
    assert isinstance(first, dict)
    assert first["name"] == "2_attn_logits" and str(first["paired_by"]).startswith("fuzzy 0.")
    assert first["candidate_name"] == "2_attn_logits_masked"
    culprits = out["culprits"]
    assert isinstance(culprits, list) and culprits[0]["name"] == "2_attn_logits"
    assert culprits[0]["paired_by"] == first["paired_by"] and culprits[0]["candidate_name"] == "2_attn_logits_masked"
    table = main_cli("--data-dir", str(tmp_path / "data"), "compare", str(a), str(b)).stdout
    guess = f"paired by {first['paired_by']} with the candidate's 2_attn_logits_masked: a guess"
    assert f"FIRST DIVERGENCE: 2_attn_logits (layer 2, stage attn_logits; {guess})" in table
    assert f"CULPRIT: 2_attn_logits ({guess}) added" in table


def test_the_session_page_says_the_order_and_the_guess(shared_server: LiveServer, tmp_path: Path) -> None:
    data = str(shared_server.data_dir)
    ids = []
    for folder, make in (("scores", with_scores), ("fuzzy", fuzzy_paired)):
        (tmp_path / folder).mkdir()
        done = main_cli("--data-dir", data, "compare", *map(str, make(tmp_path / folder)), "--name", folder, "--json")
        ids.append(json.loads(done.stdout)["session"]["id"])
    pages = [
        loopback_http.get(f"{shared_server.url}/sessions/{i}", headers=shared_server.auth, timeout=30).text for i in ids
    ]
    banner = pages[0][pages[0].index('class="banner fail"') :]
    banner = banner[: banner.index("</p>")]
    assert "First divergence" not in banner
    assert "A divergence (no execution order is known: layer 0&#39;s stages attn_probs and attn_scores" in banner
    assert "No stage of layer 0 is named a culprit" in pages[0]
    banner = pages[1][pages[1].index('class="banner fail"') :]
    banner = banner[: banner.index("</p>")]
    assert (
        'id="first-divergence-guess"' in banner and "with the candidate&#39;s 2_attn_logits_masked: a guess" in banner
    )
    assert 'id="stage-culprit-guess"' in pages[1]


def test_the_guessing_strategies_are_the_stores_shape_and_fuzzy() -> None:
    """guessed_pairs names them as text (the store's models stay out of the CLI's light imports): the same two."""
    assert frozenset({str(PairingStrategy.SHAPE), str(PairingStrategy.FUZZY)}) == GUESSING
