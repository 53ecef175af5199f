"""`tensor-debugger ARGS` through the CLI's `main(argv)` in the test's own process: for a test about what a command
prints, stores or hands to a server, not about the process (its imports, its exit on a signal: those stay
`servers.run_cli` in a child). Saves the child's start, about half a second of CPU each."""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
from tensor_debugger.cli.main import main


@dataclass(frozen=True)
class CliRun:
    """What a command returned and printed, as `subprocess.CompletedProcess` names them."""

    returncode: int
    stdout: str
    stderr: str


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> CliRun:
    """`main(args)` with no TENSOR_DEBUGGER_ setting in the environment (as `run_cli` gives a child), and what it
    printed."""
    capsys.readouterr()  # what the test printed before is not the command's
    with pytest.MonkeyPatch.context() as patch:
        for name in [k for k in os.environ if k.startswith("TENSOR_DEBUGGER_")]:
            patch.delenv(name)
        code = main(list(args))
    out, err = capsys.readouterr()
    return CliRun(code, out, err)
