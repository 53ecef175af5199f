"""A run holding two tensors of one name (`0_query.npy` and `0_query.pth` in one folder): both files were read, so
nothing says one "could not be read"; the problem names both files and which one is paired by the name, and the
comparison is no pass, whichever way the guessed pair went."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from tests.support import loopback_http
from tests.support.cli_main import main_cli
from tests.support.dumps import seeded
from tests.support.servers import LiveServer


def runs(root: Path) -> tuple[Path, Path]:
    """The reference one `0_query.pth`; the candidate a `0_query.npy` equal to it and a `0_query.pth` that is not
    (the `.npy` comes first: paired by the name, it passes)."""
    query, key = seeded((4, 4), 1), seeded((4, 4), 2)
    for side in ("a", "b"):
        (root / side).mkdir()
        torch.save(query, root / side / "0_query.pth")
        torch.save(key, root / side / "0_key.pth")
    torch.save(query + 7, root / "b" / "0_query.pth")
    np.save(root / "b" / "0_query.npy", query.numpy())
    return root / "a", root / "b"


def test_two_tensors_of_one_name_are_named_both_and_no_pass(tmp_path: Path) -> None:
    a, b = runs(tmp_path)
    data = str(tmp_path / "data")
    done = main_cli("--data-dir", data, "compare", str(a), str(b))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "could not be read" not in done.stdout
    assert (
        f"problem: {b / '0_query.pth'}: a second tensor named '0_query' (the first is from {b / '0_query.npy'}, and "
        f"that one is paired by the name); kept as 0_query (2)" in done.stdout
    )
    assert f"AMBIGUOUS: a run holds two tensors of one name ({b / '0_query.pth'}: see problem above)" in done.stdout
    assert "no divergence among the pairs compared" in done.stdout
    out = json.loads(main_cli("--data-dir", data, "compare", str(a), str(b), "--json").stdout)
    assert out["verdict"] == "incomplete"
    assert [p["file"] for p in out["problems"]] == [str(b / "0_query.pth")]
    assert str(b / "0_query.npy") in out["problems"][0]["reason"]


def test_the_session_page_says_ambiguous_not_could_not_be_read(shared_server: LiveServer, tmp_path: Path) -> None:
    a, b = runs(tmp_path)
    data = str(shared_server.data_dir)
    done = main_cli("--data-dir", data, "compare", str(a), str(b), "--name", "two of one name", "--json")
    session_id = json.loads(done.stdout)["session"]["id"]
    page = loopback_http.get(f"{shared_server.url}/sessions/{session_id}", headers=shared_server.auth, timeout=30).text
    assert "could not be read" not in page
    banner = page[page.index('id="second-tensors"') :]
    banner = banner[: banner.index("</p>")]
    assert f"Ambiguous: a run holds two tensors of one name ({b / '0_query.pth'})" in banner
    assert "so this is no pass" in banner


def test_compare_sessions_says_ambiguous_not_could_not_be_read(tmp_path: Path) -> None:
    """compare-sessions counted the second tensor's problem among the files that could not be read: both were read,
    and its words and its JSON say what it is."""
    a, b = runs(tmp_path)
    data = str(tmp_path / "data")
    done = main_cli("--data-dir", data, "compare", str(a), str(b), "--name", "twice")
    assert done.returncode == 2, done.stdout + done.stderr
    diff = main_cli("--data-dir", data, "compare-sessions", "twice", "twice")
    assert "could not be read" not in diff.stdout
    assert (
        "A: twice (session 1): no divergence among the pairs compared, but INCOMPLETE: AMBIGUOUS: 1 input file holds "
        "a second tensor of a name its run already had (which one is paired by the name is a guess)" in diff.stdout
    )
    out = json.loads(main_cli("--data-dir", data, "compare-sessions", "twice", "twice", "--json").stdout)
    assert out["a"]["verdict"] == "incomplete"
    assert (out["a"]["coverage"]["unread_files"], out["a"]["coverage"]["ambiguous_files"]) == (0, 1)
