"""Worst elements of a planted difference (one attention head, a few tokens) through the CLI, the API and the pair
page, whose rows open the inspector on their element."""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import torch

from tests.support import loopback_http as http
from tests.support.cli_main import main_cli
from tests.support.dumps import make_zip, seeded
from tests.support.servers import LiveServer, run_cli, upload, wait_done

HEADS, TOKENS, DIM = 4, 24, 16
PLANTED = {(2, 5, 3): 0.9, (2, 6, 3): 0.7, (2, 7, 11): 0.5}  # head 2, tokens 5 to 7


def planted_runs(root: Path) -> tuple[Path, Path]:
    """Two runs of an attention output [heads, tokens, dim] and a later stage; the candidate's output differs at
    PLANTED (by those amounts) and by 1e-7 elsewhere in head 2."""
    ref, cand = root / "ref", root / "cand"
    ref.mkdir()
    cand.mkdir()
    attn = seeded((HEADS, TOKENS, DIM), 3)
    moved = attn.clone()
    moved[2] += 1e-7
    for index, amount in PLANTED.items():
        moved[index] += amount
    torch.save(attn, ref / "0_attn_out.pth")
    torch.save(moved, cand / "0_attn_out.pth")
    for side in (ref, cand):
        torch.save(seeded((8, 8), 4), side / "1_mlp_out.pth")
    return ref, cand


def check_worst(worst: list[dict[str, object]], top: int) -> None:
    assert [w["index"] for w in worst[:3]] == [list(i) for i in PLANTED]
    assert len(worst) == top
    diffs = [float(w["abs_diff"]) for w in worst]  # type: ignore[arg-type]
    assert diffs == sorted(diffs, reverse=True)
    assert abs(diffs[0] - 0.9) < 1e-6 and float(worst[0]["b"]) - float(worst[0]["a"]) == diffs[0]  # type: ignore[arg-type]
    assert all(w["index"][0] == 2 for w in worst)  # type: ignore[index]


def test_cli_json_carries_the_worst_elements_and_top_sets_how_many(tmp_path: Path) -> None:
    ref, cand = planted_runs(tmp_path)
    # in this process: what the command prints is the point here, not its start-up
    out = main_cli("--data-dir", str(tmp_path / "data"), "compare", str(ref), str(cand), "--top", "5", "--json")
    assert out.returncode == 1, out.stderr
    pairs = {p["name"]: p for p in json.loads(out.stdout)["pairs"]}
    check_worst(pairs["0_attn_out"]["stats"]["worst"], 5)
    assert pairs["1_mlp_out"]["stats"]["worst"] == []  # identical: no element differs
    refused = run_cli("--data-dir", str(tmp_path / "data"), "compare", str(ref), str(cand), "--top", "65")
    assert refused.returncode != 0 and "top" in refused.stderr


def test_api_and_pair_page_show_the_worst_elements(shared_server: LiveServer, tmp_path: Path) -> None:
    ref, cand = planted_runs(tmp_path)
    files = [("reference", make_zip(ref, tmp_path / "r.zip")), ("candidate", make_zip(cand, tmp_path / "c.zip"))]
    response = upload(shared_server, "worst elements", files)
    assert response.status_code == 201, response.text
    report = wait_done(shared_server, int(response.json()["session"]["id"]))
    pair_id = report["first_divergence"]["pair_id"]
    detail = http.get(f"{shared_server.url}/api/pairs/{pair_id}").json()
    check_worst(detail["stats"]["worst"], 8)
    page = http.get(f"{shared_server.url}/pairs/{pair_id}").text
    section = page[page.index('id="worst"') :]
    links = re.findall(r'<a href="([^"]+)#inspector">\[([\d, ]+)\]</a>', section)
    assert [index for _, index in links[:3]] == ["2, 5, 3", "2, 6, 3", "2, 7, 11"]
    url = links[2][0].replace("&amp;", "&")
    window = dict(parse_qsl(urlsplit(url).query))
    start, count = int(window["start"]), int(window["count"])
    assert window["index"] == "2,7,:" and start <= 11 < start + count  # the window holds [2, 7, 11]
    assert http.get(f"{shared_server.url}{url}").status_code == 200


def test_error_profiles_along_heads_and_tokens_through_the_api_and_the_page(
    shared_server: LiveServer, tmp_path: Path
) -> None:
    ref, cand = planted_runs(tmp_path)
    files = [("reference", make_zip(ref, tmp_path / "r.zip")), ("candidate", make_zip(cand, tmp_path / "c.zip"))]
    response = upload(shared_server, "error profiles", files)
    assert response.status_code == 201, response.text
    report = wait_done(shared_server, int(response.json()["session"]["id"]))
    pair_id = report["first_divergence"]["pair_id"]
    api = f"{shared_server.url}/api/pairs/{pair_id}/profile"
    heads = http.get(api, params={"dim": 0}).json()
    assert (heads["dim"], heads["size"]) == (0, HEADS)
    assert [h > 0 for h in heads["max_abs_diff"]] == [False, False, True, False]
    assert abs(heads["max_abs_diff"][2] - 0.9) < 1e-6 and heads["mismatched"] == [0, 0, 3, 0]
    tokens = http.get(api, params={"dim": 1}).json()
    assert tokens["size"] == TOKENS and len(tokens["mean_abs_diff"]) == TOKENS
    assert [t for t, m in enumerate(tokens["mismatched"]) if m] == [5, 6, 7]
    assert sorted(range(TOKENS), key=lambda t: -tokens["max_abs_diff"][t])[:3] == [5, 6, 7]
    assert abs(tokens["mean_abs_diff"][5] - 0.9 / (HEADS * DIM)) < 1e-6  # one 0.9 among 64 elements
    assert http.get(api, params={"dim": 1}).json() == tokens  # kept with the result
    bad = http.get(api, params={"dim": 3})
    assert bad.status_code == 400 and "dim must be 0 to 2" in bad.json()["detail"]
    page = http.get(f"{shared_server.url}/pairs/{pair_id}", params={"profile": "1"}).text
    section = page[page.index('id="profile"') :]
    assert 'class="profile-max" points="' in section and "the worst is index 5" in section
    assert '<option value="1" selected>' in section
