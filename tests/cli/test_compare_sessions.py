"""`compare-sessions S1 S2`: did my fix help, and did it break anything else? Through the CLI, the API and the
page, on two sessions of the shared server (each made by a compare handed to it)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from tests.support import loopback_http
from tests.support.cli_main import main_cli
from tests.support.dumps import layered_dump
from tests.support.servers import LiveServer, upload, wait_done


@pytest.fixture(scope="module")
def sessions(_shared_server: LiveServer, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, int]:
    """ "diff before": a candidate diverging from layer 1; "diff after": one diverging from layer 2 (the fix)."""
    root = tmp_path_factory.mktemp("session-diff")
    ref = layered_dump(root / "ref", None)
    ids = []
    for name, bug in (("diff before", 1), ("diff after", 2)):
        candidate = layered_dump(root / name.replace(" ", "-"), bug)
        done = main_cli(
            "--data-dir", str(_shared_server.data_dir), "compare", str(ref), str(candidate), "--name", name, "--json"
        )
        assert done.returncode == 1, done.stderr
        ids.append(json.loads(done.stdout)["session"]["id"])
    return ids[0], ids[1]


def test_compare_sessions_cli(shared_server: LiveServer, sessions: tuple[int, int]) -> None:
    data = str(shared_server.data_dir)
    done = main_cli("--data-dir", data, "compare-sessions", "diff before", str(sessions[1]), "--json")
    assert done.returncode == 0, done.stderr  # nothing broke
    out = json.loads(done.stdout)
    assert (out["a"]["name"], out["b"]["name"]) == ("diff before", "diff after")
    assert out["a"]["first_divergence"]["name"] == "1_attn" and out["b"]["first_divergence"]["name"] == "2_attn"
    changes = {p["key"]: (p["status_a"], p["status_b"], p["change"]) for p in out["pairs"]}
    assert changes["0_attn"] == ("pass", "pass", "same")
    assert changes["1_mlp"] == ("fail", "pass", "fixed")
    assert changes["3_mlp"] == ("fail", "fail", "same")
    assert out["counts"] == {
        "fixed": 2,
        "broken": 0,
        "better": 0,
        "worse": 0,
        "same": 6,
        "only in A": 0,
        "only in B": 0,
        "not compared": 0,
        "pending": 0,
    }
    fixed = next(p for p in out["pairs"] if p["key"] == "1_attn")
    assert fixed["error_b"] == 0 and fixed["ratio"] == 0 and abs(fixed["error_a"] - 0.5) < 1e-5
    # the other way round a fix is a break: exit 1, and the table says which
    table = main_cli("--data-dir", data, "compare-sessions", str(sessions[1]), str(sessions[0]))
    assert table.returncode == 1, table.stderr
    rows = {re.split(r"\s{2,}", line)[0]: re.split(r"\s{2,}", line) for line in table.stdout.splitlines()}
    assert rows["1_attn"] == ["1_attn", "1", "PASS", "FAIL", "0", "0.5", "inf", "BROKEN"]
    assert "0 fixed, 2 broken, 0 better, 0 worse, 6 same, 0 only in A, 0 only in B" in table.stdout
    missing = main_cli("--data-dir", data, "compare-sessions", "no such session", str(sessions[0]))
    assert missing.returncode == 2 and "no session with id or name 'no such session'" in missing.stderr


def test_compare_sessions_api_and_page(shared_server: LiveServer, sessions: tuple[int, int]) -> None:
    before, after = sessions
    api = loopback_http.get(
        f"{shared_server.url}/api/sessions/compare", params={"a": before, "b": after}, headers=shared_server.auth
    )
    assert api.status_code == 200, api.text
    assert api.json()["counts"]["fixed"] == 2
    assert (
        loopback_http.get(
            f"{shared_server.url}/api/sessions/compare", params={"a": before, "b": 10**9}, headers=shared_server.auth
        ).status_code
        == 404
    )
    page = loopback_http.get(
        f"{shared_server.url}/sessions/compare", params={"a": before, "b": after}, headers=shared_server.auth
    )
    assert page.status_code == 200
    section = page.text.split('aria-label="Changes"')[1]
    assert "2 fixed, 6 same" in section
    row = re.search(r'<tr class="change-fixed"><td class="name">(.*?)</tr>', section, re.S)
    assert row is not None and 'title="1_attn"' in row.group(1) and "<strong>fixed</strong>" in row.group(1)
    assert 'aria-label="1_attn in A"' in row.group(1) and 'aria-label="1_attn in B"' in row.group(1)
    form = loopback_http.get(
        f"{shared_server.url}/sessions/compare", headers=shared_server.auth
    )  # no sessions picked yet
    assert form.status_code == 200 and f'<option value="{after}">diff after' in form.text
    assert 'aria-label="Changes"' not in form.text


def test_pairs_not_compared_yet_are_said_not_called_clean(tmp_path: Path) -> None:
    """Runs ingested with no server up have their pairs pending: compare-sessions says so and exits 2, rather than
    "no divergence" and 0."""
    data = str(tmp_path / "data")
    ref, candidate = layered_dump(tmp_path / "ref", None), layered_dump(tmp_path / "cand", 1)
    for run, path in (("reference", ref), ("candidate", candidate)):
        done = main_cli("--data-dir", data, "ingest", "--session", "pending", "--run", run, str(path))
        assert done.returncode == 0, done.stderr
    done = main_cli("--data-dir", data, "compare-sessions", "pending", "pending")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "A: pending (session 1): " in done.stdout and "pairs not compared yet" in done.stdout
    assert "no divergence" not in done.stdout
    out = json.loads(main_cli("--data-dir", data, "compare-sessions", "pending", "pending", "--json").stdout)
    assert out["a"]["pending"] > 0 and out["a"]["first_divergence"] is None


def test_sessions_passing_on_summaries_say_so(tmp_path: Path) -> None:
    """Two sessions captured with values="summary", the candidate off by 1e-6 in one weight: each passes on
    summaries whose hashes differ, which shows no more than that no difference was found in the summary, and
    compare-sessions says so rather than a bare "no divergence"."""
    import copy

    from tensor_debugger import capture

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
    port = copy.deepcopy(model)
    with torch.no_grad():
        dict(port.named_parameters())["2.weight"][0, 0] += 1e-6
    x = torch.randn(4, 64)
    data = tmp_path / "data"
    for session in ("s1", "s2"):
        for run, net in (("reference", model), ("candidate", port)):
            with torch.no_grad(), capture(net, session, run, data_dir=data, values="summary"):
                net(x)
    done = main_cli("--data-dir", str(data), "compare-sessions", "s1", "s2")
    assert "A: s1 (session 1): no divergence found in the summaries (2 pairs passed on summaries alone" in done.stdout
    out = json.loads(main_cli("--data-dir", str(data), "compare-sessions", "s1", "s2", "--json").stdout)
    assert out["a"]["verdict"] == "no_divergence" and out["a"]["on_summaries"] == 2


def test_a_session_with_nothing_compared_yet_is_no_pass(tmp_path: Path) -> None:
    """A session holding only its reference (the candidate's ingest killed, or not run yet) is `no_candidate`
    (`comparing` before, which a script polling for a verdict waited on for ever): not "no divergence ...
    INCOMPLETE: nothing to compare" with exit 0, as if nothing had broken."""
    ref = tmp_path / "ref"
    ref.mkdir()
    torch.save(torch.ones(4), ref / "0_query.pth")
    data = str(tmp_path / "data")
    assert main_cli("--data-dir", data, "ingest", "--session", "half", "--run", "ref", str(ref)).returncode == 0
    done = main_cli("--data-dir", data, "compare-sessions", "half", "half")
    assert done.returncode == 2, done.stdout
    assert "A: half (session 1): nothing compared yet: the session has no candidate run" in done.stdout
    out = json.loads(main_cli("--data-dir", data, "compare-sessions", "half", "half", "--json").stdout)
    assert out["a"]["verdict"] == "no_candidate"


def test_a_pair_not_compared_in_either_session_is_no_change(tmp_path: Path) -> None:
    """Session "float" passes a float mask to the attention on both sides; session "bool" the same mask as a
    bool one on the candidate's side (eager attention's against SDPA's): that input pair is not one value computed
    two ways, not compared (its session's report lists it out of step), so nothing broke there: compare-sessions
    says "not compared" for it, not BROKEN, and exits 2, as where it cannot all be said."""
    from tensor_debugger import capture

    class Attention(torch.nn.Module):
        def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            return x + mask.float()

    class Net(torch.nn.Module):
        def __init__(self, as_bool: bool) -> None:
            super().__init__()
            self.attn, self.as_bool = Attention(), as_bool

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            mask = torch.ones(x.shape, dtype=torch.bool) if self.as_bool else torch.ones(x.shape)
            out: torch.Tensor = self.attn(x, mask)
            return out

    x = torch.randn(2, 4)
    data = tmp_path / "data"
    for session, port in (("float", False), ("bool", True)):
        for run, net in (("reference", Net(False)), ("candidate", Net(port))):
            with torch.no_grad(), capture(net, session, run, data_dir=data, values="summary"):
                net(x)
    out = json.loads(main_cli("--data-dir", str(data), "compare-sessions", "float", "bool", "--json").stdout)
    changes = {p["key"]: (p["status_b"], p["change"]) for p in out["pairs"]}
    assert changes["Net.attn_inputs_args_1"][1] == "not compared", changes
    done = main_cli("--data-dir", str(data), "compare-sessions", "float", "bool")
    assert "BROKEN" not in done.stdout and done.returncode == 2, done.stdout


def test_a_session_whose_every_pair_was_not_compared_has_no_pairs_to_pass_among(tmp_path: Path) -> None:
    """Its one pair incomparable (shapes [4, 6] and [4, 7]): nothing was compared, which compare-sessions says
    instead of "no divergence among the pairs compared"; exit 2."""
    for run, width in (("ref", 6), ("cand", 7)):
        (tmp_path / run).mkdir()
        torch.save(torch.ones(4, width), tmp_path / run / "0_query.pth")
    data = str(tmp_path / "data")
    made = main_cli("--data-dir", data, "compare", str(tmp_path / "ref"), str(tmp_path / "cand"), "--name", "shapes")
    assert made.returncode == 1 and "INCOMPARABLE" in made.stdout, made.stdout
    # compare itself: not "no divergence among the pairs compared: 0 of 1 pairs pass"
    assert "nothing was compared: 0 of 1 pairs compared" in made.stdout.splitlines(), made.stdout
    assert "no divergence" not in made.stdout
    done = main_cli("--data-dir", data, "compare-sessions", "shapes", "shapes")
    assert done.returncode == 2, done.stdout
    assert "A: shapes (session 1): nothing was compared: INCOMPLETE: 1 pairs could not be compared" in done.stdout
    assert "among the pairs compared" not in done.stdout


def test_the_page_of_a_session_that_compared_nothing_says_so(shared_server: LiveServer, tmp_path: Path) -> None:
    """Uploaded to the app: its one pair incomparable. The page says nothing was compared, not "no pair is outside
    tolerance"."""
    files = []
    for run, width in (("reference", 6), ("candidate", 7)):
        (tmp_path / run).mkdir()
        torch.save(torch.ones(4, width), tmp_path / run / "0_query.pth")
        files.append((run, tmp_path / run / "0_query.pth"))
    made = upload(shared_server, "compared nothing", files)
    assert made.status_code == 201, made.text
    session_id = made.json()["session"]["id"]
    wait_done(shared_server, session_id)
    page = loopback_http.get(f"{shared_server.url}/sessions/{session_id}", headers=shared_server.auth).text
    assert '<span id="nothing-compared">Incomplete: nothing was compared: 0 of 1 pairs compared.</span>' in page
    assert "no pair is outside tolerance" not in page


def test_the_page_of_a_session_that_compared_rows_of_its_one_pair_says_which(
    shared_server: LiveServer, tmp_path: Path
) -> None:
    """The candidate holds the reference's first 4 of 6 rows: the pair is incomparable, but 4 rows of it were
    compared, which the page says as the command does (not "nothing was compared")."""
    files = []
    full = torch.arange(48, dtype=torch.float32).reshape(6, 8)
    for run, values in (("reference", full), ("candidate", full[:4].clone())):
        (tmp_path / run).mkdir()
        torch.save(values, tmp_path / run / "0_query.pth")
        files.append((run, tmp_path / run / "0_query.pth"))
    made = upload(shared_server, "compared in part", files)
    assert made.status_code == 201, made.text
    session_id = made.json()["session"]["id"]
    wait_done(shared_server, session_id)
    page = loopback_http.get(f"{shared_server.url}/sessions/{session_id}", headers=shared_server.auth).text
    said = "no pair was compared whole: 1 pair compared in part (4 of 6 rows)"
    assert f'<span id="nothing-compared">Incomplete: {said}.</span>' in page, page
    assert "nothing was compared" not in page
