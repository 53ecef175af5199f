"""The CLI contract that scripts rely on: JSON shapes, exit codes, --data-dir and the environment variable (through
`main(argv)` in this process; one test runs the command as a process, to see a real exit status)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.support.backends import BACKEND_FIXTURES, BACKENDS
from tests.support.cli_main import main_cli
from tests.support.dumps import make_zip, seeded
from tests.support.servers import run_cli


@pytest.mark.parametrize(BACKEND_FIXTURES, BACKENDS, indirect=True)
def test_ingest_and_sessions_json(tmp_path: Path, backend_env: dict[str, str]) -> None:
    folder = tmp_path / "ref"
    folder.mkdir()
    torch.save(seeded((4, 4), 0), folder / "0_query.pth")
    torch.save(seeded((4, 4), 1), folder / "0_key.pth")
    (folder / "notes.txt").write_text("not a tensor")
    archive = make_zip(folder, tmp_path / "ref.zip")
    data = tmp_path / "data"
    env = backend_env
    done = main_cli(
        "--data-dir",
        str(data),
        "ingest",
        "--session",
        "port vs ref",
        "--run",
        "reference",
        str(archive),
        "--json",
        env=env,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["session"]["name"] == "port vs ref" and isinstance(out["session"]["id"], int)
    assert out["run"]["label"] == "reference" and out["run"]["tensors"] == 2
    assert out["problems"] == [
        {
            "file": f"{archive}/notes.txt",
            "reason": "not a tensor file or archive (unknown extension '.txt'); skipped",
            "ignored": True,
            "note": False,
        }
    ]
    listed = main_cli("--data-dir", str(data), "sessions", "--json", env=env)
    assert listed.returncode == 0
    sessions = json.loads(listed.stdout)
    assert [(s["name"], [(r["label"], r["tensors"]) for r in s["runs"]]) for s in sessions] == [
        ("port vs ref", [("reference", 2)])
    ]
    assert sessions[0]["id"] == out["session"]["id"]


def test_exit_two_when_nothing_usable(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pth"
    bad.write_bytes(b"definitely not a tensor")
    done = main_cli(
        "--data-dir",
        str(tmp_path / "data"),
        "ingest",
        "--session",
        "s",
        "--run",
        "r",
        str(bad),
        str(tmp_path / "missing.zip"),
        "--json",
    )
    assert done.returncode == 2
    out = json.loads(done.stdout)
    assert out["run"] is None
    assert [p["file"] for p in out["problems"]] == [str(tmp_path / "missing.zip"), str(bad)] or sorted(
        p["file"] for p in out["problems"]
    ) == sorted([str(bad), str(tmp_path / "missing.zip")])
    listed = main_cli("--data-dir", str(tmp_path / "data"), "sessions", "--json")
    assert json.loads(listed.stdout) == []  # the session the failed ingest would have created is not kept


def test_a_file_that_cannot_be_read_makes_the_compare_incomplete(tmp_path: Path) -> None:
    """A truncated dump is not a pass, however well the rest compares (exit 2, said last); a config.json beside the
    tensors holds none, and is only named."""
    for side in ("ref", "cand"):
        folder = tmp_path / side
        folder.mkdir()
        for layer in range(3):
            torch.save(seeded((8, 8), seed=layer), folder / f"{layer}_post_attn.pth")
        (folder / "config.json").write_text('{"hidden_size": 8}')
    data = str(tmp_path / "data")
    clean = main_cli("--data-dir", data, "compare", str(tmp_path / "ref"), str(tmp_path / "cand"))
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert f"ignored, no tensor in them (2): {tmp_path / 'ref'}/config.json" in clean.stdout
    assert "problem:" not in clean.stdout and "INCOMPLETE" not in clean.stdout
    truncated = tmp_path / "cand" / "1_post_attn.pth"
    truncated.write_bytes(truncated.read_bytes()[:300])
    done = main_cli("--data-dir", data, "compare", str(tmp_path / "ref"), str(tmp_path / "cand"))
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert (
        f"problem: {truncated}: not a readable PyTorch file: truncated or damaged: a zip archive of 300 bytes"
        in done.stdout
    )
    assert "no divergence among the pairs compared: 2 of 2 pairs pass" in lines
    assert lines[-2].startswith("INCOMPLETE: 1 input file could not be read"), done.stdout
    out = json.loads(
        main_cli("--data-dir", data, "compare", str(tmp_path / "ref"), str(tmp_path / "cand"), "--json").stdout
    )
    assert {(Path(p["file"]).name, p["ignored"]) for p in out["problems"]} == {
        ("config.json", True),
        ("1_post_attn.pth", False),
    }


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (("--ulp", "2", "--rtol", "0.1"), "--ulp replaces --rtol and --atol"),
        (("--noise-factor", "3"), "--noise-factor needs --noise A2"),
    ],
)
def test_options_that_contradict_or_mean_nothing_alone_are_refused(
    tmp_path: Path, options: tuple[str, ...], said: str
) -> None:
    runs = [tmp_path / "a.pth", tmp_path / "b.pth"]
    for path in runs:
        torch.save({"x": seeded((4, 4), seed=1)}, path)
    data = tmp_path / "data"
    done = main_cli("--data-dir", str(data), "compare", *map(str, runs), *options)
    assert done.returncode == 2 and said in done.stderr, done.stdout + done.stderr
    assert not (data / "metadata.sqlite3").exists()  # refused before anything is ingested


def test_an_unreadable_pairing_file_is_refused_before_anything_is_done(tmp_path: Path) -> None:
    runs = [tmp_path / "a.pth", tmp_path / "b.pth"]
    for path in runs:
        torch.save({"x": seeded((4, 4), seed=1)}, path)
    pairing = tmp_path / "pairing.json"
    pairing.write_text("[1, 2]")
    data = tmp_path / "data"
    done = main_cli("--data-dir", str(data), "compare", *map(str, runs), "--pairing", str(pairing), "--json")
    assert done.returncode == 2, done.stderr
    assert json.loads(done.stdout)["error"] == f"pairing file {pairing}: not a JSON object"
    assert not (data / "metadata.sqlite3").exists()  # no data dir opened, no run ingested


def test_environment_variable_sets_data_dir_and_human_output(tmp_path: Path) -> None:
    path = tmp_path / "1_post_mlp.pth"
    torch.save(seeded((2,), 0), path)
    env = {"TENSOR_DEBUGGER_DATA_DIR": str(tmp_path / "envdata")}
    done = main_cli("ingest", "--session", "env", "--run", "a", str(path), env=env)
    assert done.returncode == 0 and "stored 1 tensor as run" in done.stdout
    assert (tmp_path / "envdata" / "metadata.sqlite3").exists()
    assert "env" in main_cli("sessions", env=env).stdout
    again = main_cli("ingest", "--session", "env", "--run", "a", str(path), env=env)
    assert again.returncode == 2 and "already has a run labelled 'a'" in again.stderr


def test_bad_setting_is_a_clear_error(tmp_path: Path) -> None:
    """In a child process, as a script sees it: the status a real process exits with, the message on its stderr."""
    done = run_cli("--data-dir", str(tmp_path), "sessions", env={"TENSOR_DEBUGGER_PORT": "eighty"})
    assert done.returncode == 2 and "TENSOR_DEBUGGER_PORT='eighty' is not a valid int" in done.stderr
