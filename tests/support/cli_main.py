"""`tensor-debugger ARGS` run by its `main(argv)` in the test's own process, for tests about what the command prints,
stores or exits with (not about the process: start-up imports, signals, a real exit stay with `servers.run_cli`).
It skips a child's start-up and imports (a second or more a call on this machine); the result reads like
`run_cli`'s, so a test says the same either way."""

from __future__ import annotations

import contextlib
import gc
import io
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol


class Finished(Protocol):
    """What both `run_cli` (a CompletedProcess) and `main_cli` give back."""

    @property
    def returncode(self) -> int: ...
    @property
    def stdout(self) -> str: ...
    @property
    def stderr(self) -> str: ...


@dataclass(frozen=True)
class CliResult:
    """What `run_cli`'s CompletedProcess gives a test: the exit status and what was printed."""

    returncode: int
    stdout: str
    stderr: str


@contextlib.contextmanager
def cli_environ(env: dict[str, str] | None) -> Iterator[None]:
    """This process's environment with no TENSOR_DEBUGGER_ setting but those in `env` (and `env`'s others), as a
    child of `run_cli` sees it; the environment as it was afterwards."""
    saved = dict(os.environ)
    for key in [k for k in os.environ if k.startswith("TENSOR_DEBUGGER_")]:
        del os.environ[key]
    os.environ.update(env or {})
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def main_cli(*args: str, env: dict[str, str] | None = None) -> CliResult:
    """`tensor-debugger ARGS` through `main(argv)` here, with the environment `run_cli` would give a child."""
    from tensor_debugger.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    try:
        with cli_environ(env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exit_:  # argparse's errors, as the entry point would exit
                code = exit_.code if isinstance(exit_.code, int) else 1
    finally:
        gc.unfreeze()  # main freezes what a one-shot command's start-up built; this process goes on
    return CliResult(code, out.getvalue(), err.getvalue())
