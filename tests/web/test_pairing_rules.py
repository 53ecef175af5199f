"""A session's pairing rules and pairing files: `compare --strategies --name-pattern --pairing`, and
`GET`/`PUT /api/sessions/{id}/pairing` on a live server; the rules persist with the session."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tensor_debugger.cli.compare import run_compare
from tensor_debugger.cli.compare_output import compare_request
from tensor_debugger.services import Services
from tensor_debugger.store import catalog

from tests.support import loopback_http as http
from tests.support.dumps import make_zip
from tests.support.dumps import named_dump as dump
from tests.support.servers import LiveServer, upload


def compare(
    services: Services, capsys: pytest.CaptureFixture[str], a: Path, b: Path, **kwargs: Any
) -> tuple[int, dict[str, Any]]:
    code = run_compare(services, compare_request(a, b, None, None, None, **kwargs), True)
    return code, json.loads(capsys.readouterr().out)


def test_name_pattern_gives_layers_and_stages(
    services: Services, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = dump(tmp_path / "a", ["L1_mlp", "L0_attn_out", "L0_norm"])
    b = dump(tmp_path / "b", ["L1_mlp", "L0_attn_out", "L0_norm"])
    code, out = compare(services, capsys, a, b, name_pattern=r"L(?P<layer>\d+)_(?P<stage>[a-z_]+)")
    assert code == 0
    assert [(p["name"], p["layer"], p["stage"], p["strategy"]) for p in out["pairs"]] == [
        ("L0_attn_out", 0, "attn_out", "layer_stage"),
        ("L0_norm", 0, "norm", "layer_stage"),
        ("L1_mlp", 1, "mlp", "layer_stage"),
    ]
    with services.sessions() as db:
        session = catalog.get_session(db, out["session"]["id"])
        assert session.name_pattern == r"L(?P<layer>\d+)_(?P<stage>[a-z_]+)" and session.strategies is None


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"name_pattern": "L(?P<layer>\\d+"}, "is not a regular expression"),
        ({"name_pattern": "L(?P<layer>\\d+)"}, "has no named group 'stage'"),
        ({"strategies": "name,fuzy"}, "unknown pairing strategy 'fuzy'"),
    ],
)
def test_bad_rules_exit_two_before_any_ingest(
    services: Services, tmp_path: Path, capsys: pytest.CaptureFixture[str], kwargs: dict[str, str], words: str
) -> None:
    a = dump(tmp_path / "a", ["x"])
    code, out = compare(services, capsys, a, a, **kwargs)
    assert code == 2 and words in out["error"]
    with services.sessions() as db:
        assert not catalog.list_sessions(db)


def test_strategies_and_pairing_file(services: Services, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = dump(tmp_path / "a", ["blocks.3.attention_out", "blocks.3.mlp", "odd"])
    b = dump(tmp_path / "b", ["blocks.3.attn_out", "blocks.3.mlp", "even"])
    code, out = compare(services, capsys, a, b)
    assert {(p["a"]["name"], p["b"]["name"], p["strategy"]) for p in out["pairs"]} == {
        ("blocks.3.attention_out", "blocks.3.attn_out", "fuzzy 0.95"),
        ("blocks.3.mlp", "blocks.3.mlp", "name"),
        ("odd", "even", "shape"),
    }
    code, out = compare(services, capsys, a, b, strategies="name")
    # two reference tensors without partner: the one pair passes, but the comparison is incomplete
    assert [p["strategy"] for p in out["pairs"]] == ["name"] and code == 1 and out["verdict"] == "incomplete"
    assert out["unmatched"] == {"a": ["blocks.3.attention_out", "odd"], "b": ["blocks.3.attn_out", "even"]}
    pairing = tmp_path / "pairing.json"
    pairing.write_text(
        json.dumps(
            {"strategies": ["name", "fuzzy"], "pairs": [{"a": "odd", "b": "even"}], "unpaired": [{"a": "blocks.3.mlp"}]}
        )
    )
    code, out = compare(services, capsys, a, b, pairing=pairing)
    assert {(p["a"]["name"], p["b"]["name"], p["strategy"]) for p in out["pairs"]} == {
        ("blocks.3.attention_out", "blocks.3.attn_out", "fuzzy 0.95"),
        ("odd", "even", "manual"),
    }
    assert out["unmatched"] == {"a": ["blocks.3.mlp"], "b": ["blocks.3.mlp"]}
    # left unpaired by the file: the user's choice, not a gap in the comparison
    assert out["coverage"]["allowed_unmatched"] == ["blocks.3.mlp"] and out["coverage"]["unmatched"] == []
    assert code == 0 and out["verdict"] == "no_divergence"
    pairing.write_text(json.dumps({"pairs": [{"a": "odd"}]}))
    code, out = compare(services, capsys, a, b, pairing=pairing)
    assert code == 2 and 'pairs[0] must be an object with "a" and "b"' in out["error"]


def test_pairing_file_through_the_api(shared_server: LiveServer, tmp_path: Path) -> None:
    a = make_zip(dump(tmp_path / "a", ["L0_attention_out", "L0_mlp", "L1_mlp", "lonely"]), tmp_path / "a.zip")
    b = make_zip(dump(tmp_path / "b", ["L0_attn_out", "L0_mlp", "L1_mlp", "alone"], seed=1), tmp_path / "b.zip")
    response = upload(shared_server, "pairing api", [("reference", a), ("candidate", b)])
    assert response.status_code == 201, response.text
    url = f"{shared_server.url}/api/sessions/{response.json()['session']['id']}/pairing"
    exported = http.get(url).json()
    assert exported["strategies"] is None and exported["name_pattern"] is None
    assert {(p["a"], p["b"]) for p in exported["pairs"]} == {
        ("L0_attention_out", "L0_attn_out"),
        ("L0_mlp", "L0_mlp"),
        ("L1_mlp", "L1_mlp"),
        ("lonely", "alone"),
    }
    assert exported["unpaired"] == []
    changed = http.put(
        url,
        json={"strategies": ["layer_stage", "name"], "name_pattern": r"L(?P<layer>\d+)_(?P<stage>\w+)", "pairs": []},
    ).json()
    assert changed["strategies"] == ["layer_stage", "name"]
    assert {(p["a"], p["b"]) for p in changed["pairs"]} == {("L0_mlp", "L0_mlp"), ("L1_mlp", "L1_mlp")}
    # tensors that merely found no partner are not refusals: listing them would allow them once imported again
    assert changed["unpaired"] == []
    report = http.get(url.replace("/pairing", "/pairs")).json()
    assert report["verdict"] == "diverged"  # L1_mlp fails; two reference tensors were not compared besides
    assert set(report["coverage"]["unmatched"]) == {"L0_attention_out", "lonely"}
    # what was exported comes back: its pairs are manual now
    again = http.put(url, json=exported).json()
    assert {(p["a"], p["b"]) for p in again["pairs"]} == {(p["a"], p["b"]) for p in exported["pairs"]}
    pairs = http.get(url.replace("/pairing", "/pairs")).json()["pairs"]
    assert {p["strategy"] for p in pairs} == {"manual"}
    for body, words in [
        ({"name_pattern": "L(?P<layer>"}, "not a regular expression"),
        ({"strategies": ["shape", "nope"]}, "unknown pairing strategy 'nope'"),
        ({"pears": []}, "no key 'pears'"),
        ({"strategies": "shape,name"}, "strategies must be a list"),  # the document says a list
        ({"strategies": ["fuzzy:0.5", "fuzzy"]}, "named twice"),  # and fuzzy at most once (maxContains)
    ]:
        bad = http.put(url, json=body)
        assert bad.status_code == 400 and words in bad.json()["detail"], bad.text
