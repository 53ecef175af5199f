"""Dependency direction and documentation, checked by reading the code and the README."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tensor_debugger.settings import setting_docs

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "server" / "tensor_debugger"
README = REPO / "README.md"


def imports_of(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


LAYERS = ["cli", "web", "live", "demo", "services.py", "compare", "ingest", "store", "engine"]


def test_import_contracts_hold() -> None:
    """The layers, the pure engine and the absence of cycles, as pyproject.toml's [tool.importlinter] states
    them, checked by import-linter over the installed package."""
    done = subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr


def test_the_tree_shows_the_layers() -> None:
    """Every module lives in a layer: the package's root holds only the wiring."""
    root = sorted(p.name for p in PACKAGE.iterdir() if p.suffix == ".py" or (p.is_dir() and p.name != "__pycache__"))
    assert root == sorted(["__init__.py", "__main__.py", "errors.py", "resources.py", "settings.py", *LAYERS])


def test_engine_imports_nothing_of_the_other_layers() -> None:
    """A second, simpler check of the engine's purity that needs no tool: its modules import only the engine."""
    for path in (PACKAGE / "engine").glob("*.py"):
        own = {i for i in imports_of(path) if i.startswith("tensor_debugger.")}
        assert all(i.startswith("tensor_debugger.engine") for i in own), f"{path.name} imports {sorted(own)}"


def test_every_setting_is_documented_in_the_readme() -> None:
    readme = README.read_text()
    missing = [env for env, _, _ in setting_docs() if env not in readme]
    assert not missing, f"README.md does not document {missing}"


def test_no_grab_bag_modules() -> None:
    names = {p.stem for p in PACKAGE.rglob("*.py")}
    assert not names & {"utils", "helpers", "misc", "common"}


def test_ci_runs_the_readmes_test_command() -> None:
    """CI runs .ci/run; it must run the very test command the README's Quick start gives a new user, and a reader of
    the README must be able to run each of its commands by hand."""
    script = (README.parent / ".ci" / "run").read_text().splitlines()
    commands = [line.strip() for line in script if line.strip().startswith("make ")]
    readme = README.read_text()
    quick_start = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert "make test" in commands and "\nmake test\n" in quick_start, commands
    lines = [line for line in readme.splitlines() if ".ci/run" in line]
    for command in commands:
        assert any(f"`{command}`" in line for line in lines), f"no README line names .ci/run with {command!r}"


def test_the_web_layer_builds_no_records() -> None:
    """Controllers and views stay thin: every change to the rows is a call below the web layer (compare/actions.py
    for what users do), so no module of web/ constructs a `*Record(...)` itself."""
    built = []
    for path in sorted((PACKAGE / "web").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = (
                    node.func.id
                    if isinstance(node.func, ast.Name)
                    else node.func.attr
                    if isinstance(node.func, ast.Attribute)
                    else ""
                )
                if name.endswith("Record"):
                    built.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {name}(")
    assert not built, f"web/ builds records: {built}"
