"""A tensor file that declares a negative size or more than 64 dimensions is refused naming the file, in every format
and however it is packed (a file of its own, a deflated zip member streamed, a stored zip member read in place),
through the API (422, never a 500, and nothing stored: a size of -10 was once stored and compared PASS) and the CLI
(exit status 2, one line per file, no traceback)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.bad_shapes import NEGATIVE, TOO_MANY, bad_shape_files
from tests.support.cli_main import main_cli
from tests.support.servers import LiveServer, upload


def member(path: Path) -> str:
    """How the problems name the file: an archive's member after the archive's name."""
    if path.suffix != ".zip":
        return path.name
    inner = path.stem.split("_", 1)[1]  # deflated_zip_pth -> zip_pth -> zip.pth
    return f"{path.name}/{inner[::-1].replace('_', '.', 1)[::-1]}"


def said(reason: str, bad: str, path: Path) -> bool:
    if bad == TOO_MANY:
        return "a tensor of 65 dimensions, past the 64 a stored array may have" in reason
    if "legacy" in path.name:  # torch.load refuses it before anything here sees it, in its words
        return "not a readable PyTorch file" in reason and "numel: integer multiplication overflow" in reason
    if "safetensors" in path.name and path.suffix != ".zip":  # safe_open refuses it, in its words
        return "not a readable safetensors file" in reason and "integer `-10`, expected usize" in reason
    return "a tensor of shape (-10,)" in reason or "tensor 'w' has shape [-10]" in reason


@pytest.mark.parametrize("bad", [NEGATIVE, TOO_MANY])
def test_the_api_refuses_each_file_with_422(shared_server: LiveServer, tmp_path: Path, bad: str) -> None:
    files = bad_shape_files(tmp_path, bad)
    response = upload(shared_server, f"bad shapes {bad}", [(f"run{i}", p) for i, p in enumerate(files)])
    assert response.status_code == 422, response.text
    runs = response.json()["runs"]
    assert len(runs) == len(files)
    for run, path in zip(runs, files, strict=True):
        assert run["status"] == "failed" and run["run_id"] is None
        [problem] = run["problems"]
        assert problem["file"] == member(path), (problem, path)
        assert said(problem["reason"], bad, path), problem


@pytest.mark.parametrize("bad", [NEGATIVE, TOO_MANY])
def test_the_cli_refuses_each_file_in_one_line(tmp_path: Path, bad: str) -> None:
    files = bad_shape_files(tmp_path, bad)
    done = main_cli("--data-dir", str(tmp_path / "data"), "ingest", "--session", "s", "--run", "r", *map(str, files))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("  ")]
    assert len(lines) == len(files), done.stderr
    for line, path in zip(lines, files, strict=True):
        assert line.startswith(f"  {path}"), (line, path)
        assert said(line, bad, path), line
