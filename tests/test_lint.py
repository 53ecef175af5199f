"""ruff and mypy --strict stay clean: cheap to keep, expensive to regain."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def test_ruff_is_clean() -> None:
    done = subprocess.run(
        [str(BIN / "ruff"), "check", "server", "tests", "bench"], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_format_is_kept() -> None:
    done = subprocess.run(
        [str(BIN / "ruff"), "format", "--check", "server", "tests", "bench"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_strict_is_clean() -> None:
    done = subprocess.run([str(BIN / "mypy")], cwd=REPO, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
