"""Pairing through the session API of a live server: the rules as fields of `GET`/`PATCH /api/sessions/{id}`,
a session exploring one uploaded run (`POST /api/sessions?explore=true`), and pairing two tensors by hand with a
chosen alignment (`GET .../alignments`, `POST .../pairs` with `alignment`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support import loopback_http
from tests.support.dumps import make_zip, seeded
from tests.support.dumps import named_dump as dump
from tests.support.postgres import DATABASES
from tests.support.servers import LiveServer, upload, wait_done


def test_rules_are_fields_of_the_session(shared_server: LiveServer, tmp_path: Path) -> None:
    a = make_zip(dump(tmp_path / "a", ["L0_attention_out", "L0_mlp", "L1_mlp"]), tmp_path / "a.zip")
    b = make_zip(dump(tmp_path / "b", ["L0_attn_out", "L0_mlp", "L1_mlp"], seed=1), tmp_path / "b.zip")
    response = upload(shared_server, "rules api", [("reference", a), ("candidate", b)])
    assert response.status_code == 201, response.text
    session_id = response.json()["session"]["id"]
    url = f"{shared_server.url}/api/sessions/{session_id}"
    shown = loopback_http.get(url).json()
    assert shown["strategies"] is None and shown["name_pattern"] is None
    assert {(p["a"]["name"], p["strategy"]) for p in wait_done(shared_server, session_id)["pairs"]} == {
        ("L0_attention_out", "fuzzy 0.95"),
        ("L0_mlp", "name"),
        ("L1_mlp", "name"),
    }
    # a change pairs the session again, as PUT .../pairing does
    pattern = r"L(?P<layer>\d+)_(?P<stage>\w+)"
    patched = loopback_http.patch(url, json={"strategies": ["layer_stage", "name"], "name_pattern": pattern})
    assert patched.status_code == 200, patched.text
    assert patched.json()["strategies"] == ["layer_stage", "name"]
    shown = loopback_http.get(url).json()
    assert shown["strategies"] == ["layer_stage", "name"] and shown["name_pattern"] == pattern
    report = wait_done(shared_server, session_id)
    assert {(p["a"]["name"], p["strategy"]) for p in report["pairs"]} == {
        ("L0_mlp", "layer_stage"),
        ("L1_mlp", "layer_stage"),
    }
    assert {u["name"] for u in report["unmatched"]} == {"L0_attention_out", "L0_attn_out"}
    # bad rules: 400 naming the problem, as the CLI says it, and nothing changed
    bad_rules: list[tuple[dict[str, Any], str]] = [
        ({"name_pattern": "L(?P<layer>\\d+"}, "is not a regular expression"),
        ({"name_pattern": "L(?P<layer>\\d+)"}, "has no named group 'stage'"),
        # what the document says (a list of known names) is checked as the body is read, naming where
        ({"strategies": ["name", "fuzy"]}, "body 'strategies[1]'"),
        ({"strategies": ["name", "fuzzy:2"]}, "body 'strategies[1]'"),
        ({"strategies": "name,fuzy"}, "body 'strategies'"),
        # what it says in uniqueItems and maxContains, by the engine, as the CLI says it
        ({"strategies": ["name", "name"]}, "named twice"),
        ({"strategies": ["fuzzy", "name", "fuzzy:0.9"]}, "named twice"),
    ]
    for body, words in bad_rules:
        bad = loopback_http.patch(url, json={"name": "renamed", **body})
        assert bad.status_code == 400 and words in bad.json()["detail"], bad.text
    unchanged = loopback_http.get(url).json()
    assert unchanged["name"] == "rules api" and unchanged["strategies"] == ["layer_stage", "name"]
    # back to the default chain and no pattern
    reset = loopback_http.patch(url, json={"strategies": [], "name_pattern": ""}).json()
    assert reset["strategies"] is None and reset["name_pattern"] is None
    assert len(wait_done(shared_server, session_id)["pairs"]) == 3


def test_explore_one_uploaded_run(shared_server: LiveServer, tmp_path: Path) -> None:
    folder = tmp_path / "acts"
    folder.mkdir()
    torch.save(
        {"q": seeded((4, 8), 1), "k": seeded((4, 8), 1), "v": seeded((8, 4), 2), "o": seeded((3,), 3)},
        folder / "acts.pth",
    )
    response = upload(shared_server, "", [("run", folder / "acts.pth")], url="/api/sessions?explore=true")
    assert response.status_code == 201, response.text
    session = response.json()["session"]
    assert session["name"] == "explore acts.pth" and len(session["runs"]) == 1
    report = wait_done(shared_server, session["id"])
    assert len(report["pairs"]) == 6 and {p["strategy"] for p in report["pairs"]} == {"explore"}
    same = next(p for p in report["pairs"] if {p["a"]["name"], p["b"]["name"]} == {"acts.q", "acts.k"})
    assert same["status"] == "pass"
    assert sum(1 for p in report["pairs"] if p["status"] == "incomparable") == 3  # o against the others
    # the exploration survives what pairs a session again (new rules, say)
    url = f"{shared_server.url}/api/sessions/{session['id']}"
    assert loopback_http.patch(url, json={"strategies": ["name"]}).status_code == 200
    assert len(wait_done(shared_server, session["id"])["pairs"]) == 6
    # the name filter
    matched = upload(
        shared_server, "explore qk", [("run", folder / "acts.pth")], url="/api/sessions?explore=true&match=*.[QK]"
    )
    assert matched.status_code == 201, matched.text
    assert [
        (p["a"]["name"], p["b"]["name"]) for p in wait_done(shared_server, matched.json()["session"]["id"])["pairs"]
    ] in ([("acts.q", "acts.k")], [("acts.k", "acts.q")])
    # past 5,000 pairs: a filter is asked for, and no session is kept
    torch.save({f"t{i}": torch.full((2,), float(i)) for i in range(101)}, tmp_path / "many.pth")
    many = upload(
        shared_server, "pairing api: too many", [("run", tmp_path / "many.pth")], url="/api/sessions?explore=true"
    )
    assert many.status_code == 400
    assert "101 tensors make 5,050 pairs, over 5,000: choose fewer with the match parameter" in many.json()["detail"]
    assert "pairing api: too many" not in {
        s["name"] for s in loopback_http.get(f"{shared_server.url}/api/sessions").json()
    }


@pytest.mark.parametrize("database_url", DATABASES, indirect=True)
def test_pair_by_hand_with_a_transpose(shared_server: LiveServer, tmp_path: Path) -> None:
    weight = seeded((32, 64), 5)
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    torch.save(weight, a / "proj_weight.pth")
    torch.save(weight.t().contiguous(), b / "weight_t.pth")
    torch.save(seeded((3, 3), 6), a / "same.pth")
    torch.save(seeded((3, 3), 6), b / "same.pth")
    response = upload(
        shared_server,
        "transpose",
        [("reference", make_zip(a, tmp_path / "a.zip")), ("candidate", make_zip(b, tmp_path / "b.zip"))],
    )
    assert response.status_code == 201, response.text
    session_id = response.json()["session"]["id"]
    base = f"{shared_server.url}/api/sessions/{session_id}"
    loopback_http.patch(base, json={"strategies": ["name"]})
    report = wait_done(shared_server, session_id)
    assert {u["name"] for u in report["unmatched"]} == {"proj_weight", "weight_t"}
    choices = loopback_http.get(f"{base}/alignments", params={"a_name": "proj_weight", "b_name": "weight_t"})
    assert choices.status_code == 200, choices.text
    listed = choices.json()
    assert listed["a_shapes"] == [[32, 64]] and listed["b_shapes"] == [[64, 32]] and not listed["same_shape"]
    transpose = next(c for c in listed["choices"] if "permuted [1, 0]" in c["words"])
    assert not transpose["last_resort"] and transpose["shape"] == [32, 64]
    assert not any(c["last_resort"] for c in listed["choices"])  # flattening is not offered where a view fits
    made = loopback_http.post(
        f"{base}/pairs", json={"a_name": "proj_weight", "b_name": "weight_t", "alignment": transpose["steps"]}
    )
    assert made.status_code == 201, made.text
    assert made.json()["strategy"] == "manual" and made.json()["alignment_overridden"]
    report = wait_done(shared_server, session_id)
    pair = next(p for p in report["pairs"] if p["a"]["name"] == "proj_weight")
    assert pair["status"] == "pass" and "permuted [1, 0]" in pair["alignment"]
    # an alignment that does not fit: 400, and nothing paired
    wrong = loopback_http.post(
        f"{base}/pairs",
        json={"a_name": "same", "b_name": "same", "alignment": [{"side": "b", "kind": "flatten", "shape": [9]}]},
    )
    assert wrong.status_code == 400 and "does not fit" in wrong.json()["detail"], wrong.text
    missing = loopback_http.get(f"{base}/alignments", params={"a_name": "nope", "b_name": "weight_t"})
    assert missing.status_code == 400 and "no tensor named 'nope'" in missing.json()["detail"]


def test_a_pair_that_cannot_be_compared_is_not_called_within_tolerance(
    shared_server: LiveServer, tmp_path: Path
) -> None:
    """Every other pair passes, one has shapes no alignment reconciles: the session page and the sessions list say
    so, instead of "no divergence" and "none" failing."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    torch.save(seeded((8, 16), 1), a / "0_post_attn.pth")
    torch.save(seeded((5, 7), 1), b / "0_post_attn.pth")
    for side in (a, b):
        torch.save(seeded((4, 4), 2), side / "0_post_mlp.pth")
    response = upload(
        shared_server,
        "one incomparable",
        [("reference", make_zip(a, tmp_path / "a.zip")), ("candidate", make_zip(b, tmp_path / "b.zip"))],
    )
    assert response.status_code == 201, response.text
    session_id = response.json()["session"]["id"]
    report = wait_done(shared_server, session_id)
    assert {p["name"]: p["status"] for p in report["pairs"]} == {"0_post_attn": "incomparable", "0_post_mlp": "pass"}
    page = loopback_http.get(f"{shared_server.url}/sessions/{session_id}", headers=shared_server.auth).text
    assert "No divergence" not in page
    assert "Incomplete: no pair is outside tolerance, but not everything was compared." in page
    assert "1 of 2 pairs could not be compared" in page
    assert report["verdict"] == "incomplete" and report["coverage"]["not_compared"] == ["0_post_attn"]
    listed = loopback_http.get(f"{shared_server.url}/?q=one+incomparable", headers=shared_server.auth).text
    assert "1 not compared" in listed and ">none<" not in listed


def test_a_candidate_with_fewer_rows_is_not_a_pass(shared_server: LiveServer, tmp_path: Path) -> None:
    """The candidate holds the first 4 of the reference's 6 rows (equal values), and another tensor no rows at all:
    the 4 rows are compared and said to be, but neither pair passes, nor does the session; the slice of the pair
    that has no aligned values answers 409 saying why, that of the cut pair its 4 compared rows."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    torch.save(seeded((6, 8), 1), a / "0_query.pth")
    torch.save(seeded((6, 8), 1)[:4].clone(), b / "0_query.pth")
    torch.save(seeded((1, 6, 8), 2), a / "0_post_attn.pth")
    torch.save(torch.zeros((1, 0, 8)), b / "0_post_attn.pth")
    response = upload(
        shared_server,
        "fewer rows",
        [("reference", make_zip(a, tmp_path / "a.zip")), ("candidate", make_zip(b, tmp_path / "b.zip"))],
    )
    assert response.status_code == 201, response.text
    session_id = response.json()["session"]["id"]
    report = wait_done(shared_server, session_id)
    pairs = {p["name"]: p for p in report["pairs"]}
    cut, empty = pairs["0_query"], pairs["0_post_attn"]
    assert cut["status"] == "incomparable" and cut["stats"]["numel"] == 32 and cut["stats"]["max_abs_diff"] == 0
    assert cut["reference_cut"] == (
        "compared 4 of the reference's 6 rows along dim 0: the candidate has 4, so 2 reference rows were not compared"
    )
    assert cut["error"] == f"not a pass: {cut['reference_cut']}; the rows compared are within tolerance"
    assert "reference cut to its first 4 of 6 rows along dim 0 (2 reference rows not compared)" in cut["alignment"]
    assert empty["status"] == "incomparable" and empty["stats"] is None and empty["aligned_shape"] is None
    assert report["verdict"] == "incomplete"
    assert sorted(report["coverage"]["not_compared"]) == ["0_post_attn", "0_query"]
    page = loopback_http.get(f"{shared_server.url}/sessions/{session_id}", headers=shared_server.auth).text
    assert "No divergence" not in page and "Incomplete" in page
    pair_page = loopback_http.get(f"{shared_server.url}/pairs/{cut['id']}", headers=shared_server.auth)
    assert pair_page.status_code == 200 and 'id="reference-cut">Not a pass: compared 4 of the' in pair_page.text
    assert "2 reference rows were not compared. These statistics are of the rows compared only." in pair_page.text
    compared = loopback_http.get(f"{shared_server.url}/api/pairs/{cut['id']}/slice", params={"index": "3,:"})
    assert compared.status_code == 200 and compared.json()["window"] == [{"dim": 1, "start": 0, "count": 8}]
    refused = loopback_http.get(f"{shared_server.url}/api/pairs/{empty['id']}/slice", params={"index": ":,:"})
    assert refused.status_code == 409, refused.text
    assert refused.json()["detail"] == (
        f"pair {empty['id']} (0_post_attn) is incomparable (no alignment makes its shapes comparable): it has no "
        "aligned values to read"
    )
