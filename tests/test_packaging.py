"""`pip install .` (not only editable) gives a working app: templates, static files, migrations and the compiled
statistics kernel ship."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_wheel_ships_web_and_migrations_and_runs(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        check=True,
        timeout=300,
    )
    wheel = next(tmp_path.glob("tensor_debugger-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in (
        "tensor_debugger/web/templates/sessions.html",
        "tensor_debugger/web/static/app.css",
        "tensor_debugger/migrations/env.py",
        "tensor_debugger/migrations/script.py.mako",
        "tensor_debugger/cli/main.py",
        "tensor_debugger/engine/_fused_stats.so",
        "tensor_debugger/compare/compute/_chunk_loop.so",
        "tensor_debugger/engine/kernel_structs.h",
    ):
        assert required in names, required
    assert not wheel.name.endswith("-none-any.whl"), wheel.name  # the compiled kernel makes it platform-specific
    assert any(n.startswith("tensor_debugger/migrations/versions/") and n.endswith(".py") for n in names)
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        check=True,
        timeout=300,
    )
    probe = (
        "import tensor_debugger, pathlib;"
        "from tensor_debugger.resources import resource_dir;"
        "from tensor_debugger.settings import Settings;"
        "from tensor_debugger.web.app import create_app;"
        "from litestar.testing import TestClient;"
        f"s = Settings(data_dir=pathlib.Path({str(tmp_path / 'data')!r}), demo=False);"
        "assert str(resource_dir('web')).startswith(str(pathlib.Path(tensor_debugger.__file__).parent));"
        "c = TestClient(create_app(s), base_url='http://127.0.0.1').__enter__();"  # an allowed Host
        "r = c.get('/');"
        "assert r.status_code == 200 and 'New session' in r.text, r.text[:300];"
        "from tensor_debugger.engine.fused import kernel_name;"
        "assert kernel_name() == 'compiled', kernel_name();"
        "print(tensor_debugger.__file__)"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(str(site))


def test_the_repository_tracks_no_built_library() -> None:
    """A clone compiles its kernels on install: no compiled library is committed (a stale one beside the sources
    would be loaded by nothing, and outlive every change to its C), and those the build writes are ignored."""
    if not (REPO / ".git").exists():
        pytest.skip(f"{REPO} is not a git checkout")
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True, timeout=60
    ).stdout.split("\0")
    assert [name for name in tracked if name.endswith((".so", ".pyd", ".dylib", ".o"))] == []
    built = [  # server/build_hooks.py's, and one a module moved elsewhere would build
        "server/tensor_debugger/engine/_fused_stats.so",
        "server/tensor_debugger/compare/compute/_chunk_loop.so",
        "server/tensor_debugger/compare/_chunk_loop.so",
    ]
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", *built], cwd=REPO, capture_output=True, text=True, timeout=60
    ).stdout.split()
    assert ignored == built
