"""A zip member whose name holds a NUL byte (zipfile cuts the name there: `0_x.npy\\0../../escape`) refuses the
whole archive, through the API (422 naming the archive) and the CLI (exit status 2, one line)."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np

from tests.support.cli_main import main_cli
from tests.support.servers import LiveServer, upload


def nul_zip(path: Path) -> Path:
    """A zip of a good .npy and one whose name, in both its local header and the central directory, is
    `1_x.npy` + NUL + `../../escape`, written with a placeholder and then patched (zipfile writes no NUL)."""
    npy = io.BytesIO()
    np.save(npy, np.ones(4, dtype=np.float32))
    placeholder, raw = b"1_x.npy#../../escape", b"1_x.npy\x00../../escape"
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("0_good.npy", npy.getvalue())
        z.writestr(placeholder.decode(), npy.getvalue())
    data = out.getvalue()
    assert data.count(placeholder) == 2  # the local header's and the central directory's
    path.write_bytes(data.replace(placeholder, raw))
    with zipfile.ZipFile(path) as z:  # what zipfile makes of it: the name cut at the NUL
        assert [i.filename for i in z.infolist()] == ["0_good.npy", "1_x.npy"]
    return path


REASON = "member '1_x.npy\\x00../../escape' has a NUL byte in its name; the archive was refused"


def test_the_api_refuses_the_archive(shared_server: LiveServer, tmp_path: Path) -> None:
    response = upload(shared_server, "nul member", [("ref", nul_zip(tmp_path / "nul.zip"))])
    assert response.status_code == 422, response.text
    [run] = response.json()["runs"]
    assert run["problems"] == [{"file": "nul.zip", "reason": REASON, "ignored": False, "note": False}]


def test_the_cli_refuses_the_archive(tmp_path: Path) -> None:
    archive = nul_zip(tmp_path / "nul.zip")
    done = main_cli("--data-dir", str(tmp_path / "data"), "ingest", "--session", "s", "--run", "r", str(archive))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert [line for line in done.stderr.splitlines() if line.startswith("  ")] == [f"  {archive}: {REASON}"]
