"""The sessions list says of a session what its report says: a pair whose alignment cut reference rows away is no
pass (engine/alignment.cut_verdict), so a session holding one shows it among the pairs not compared, never the
pass badge, where the noise rule judged it (its row holds the tolerances' verdict) and where an older version
stored it as a pass (its row read again through the report)."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
from litestar.testing import TestClient
from numpy.typing import NDArray
from tensor_debugger.settings import Settings
from tensor_debugger.web.app import create_app

from tests.support.cli_main import main_cli


def _saved(folder: Path, tensors: dict[str, NDArray[Any]]) -> Path:
    folder.mkdir()
    for name, values in tensors.items():
        np.save(folder / f"{name}.npy", values)
    return folder


def _listed(data: Path, session_id: int) -> str:
    """The sessions list's verdict cell of the session (its figures: failing, not compared, the pass badge)."""
    with TestClient(create_app(Settings(data_dir=data, demo=False)), base_url="http://127.0.0.1") as client:
        page = client.get("/")
    assert page.status_code == 200
    row = re.search(rf'<a href="/sessions/{session_id}">.*?</tr>', page.text, re.S)
    assert row is not None
    cells = re.findall(r'<td class="num">(.*?)</td>', row.group(0), re.S)
    assert len(cells) == 2  # the pairs, then the verdict
    return str(cells[1])


def _values() -> tuple[NDArray[Any], NDArray[Any]]:
    rng = np.random.default_rng(0)
    return rng.standard_normal((6, 4)).astype(np.float32), rng.standard_normal(3).astype(np.float32)


def test_a_cut_pair_within_the_noise_is_listed_not_compared(tmp_path: Path) -> None:
    """The candidate holds the reference's first 4 of 6 rows of `x`, 0.02 off, within a rerun's noise of 0.01
    (times the noise factor): incomparable, as the CLI says, and so the list."""
    x, y = _values()
    ref = _saved(tmp_path / "ref", {"x": x, "y": y})
    rerun = _saved(tmp_path / "rerun", {"x": x + np.float32(0.01), "y": y})
    cand = _saved(tmp_path / "cand", {"x": x[:4] + np.float32(0.02), "y": y})
    data = tmp_path / "data"
    done = main_cli("--data-dir", str(data), "compare", str(ref), str(cand), "--noise", str(rerun), "--json")
    assert done.returncode == 1, done.stderr
    out = json.loads(done.stdout)
    assert [(p["name"], p["status"]) for p in out["pairs"] if p["candidate"] == "cand"] == [
        ("x", "incomparable"),
        ("y", "pass"),
    ]
    cell = _listed(data, out["session"]["id"])
    assert "1 not compared" in cell and "badge pass" not in cell


def test_a_cut_pair_stored_as_a_pass_by_an_older_version_is_listed_not_compared(tmp_path: Path) -> None:
    """A data dir whose cut pair was settled "pass" before the rule: the list judges it again, as the report does."""
    x, y = _values()
    ref = _saved(tmp_path / "ref", {"x": x, "y": y})
    cand = _saved(tmp_path / "cand", {"x": x[:4], "y": y})
    data = tmp_path / "data"
    done = main_cli("--data-dir", str(data), "compare", str(ref), str(cand), "--json")
    assert done.returncode == 1, done.stderr
    session_id = json.loads(done.stdout)["session"]["id"]
    with sqlite3.connect(data / "metadata.sqlite3") as db:
        stored = db.execute(
            "UPDATE pairs SET status = 'pass', error = NULL WHERE session_id = ? AND status = 'incomparable'",
            (session_id,),
        )
        assert stored.rowcount == 1
    cell = _listed(data, session_id)
    assert "1 not compared" in cell and "badge pass" not in cell


def test_a_padded_candidate_is_listed_as_a_pass(tmp_path: Path) -> None:
    """The candidate's extra rows cut away (a vocabulary padded to a multiple) leave every reference row compared:
    the pass stands, on the list too."""
    x, y = _values()
    ref = _saved(tmp_path / "ref", {"x": x, "y": y})
    cand = _saved(tmp_path / "cand", {"x": np.concatenate([x, np.zeros((2, 4), np.float32)]), "y": y})
    data = tmp_path / "data"
    done = main_cli("--data-dir", str(data), "compare", str(ref), str(cand), "--json")
    assert done.returncode == 0, done.stderr
    cell = _listed(data, json.loads(done.stdout)["session"]["id"])
    assert '<span class="badge pass">none</span>' in cell and "not compared" not in cell
