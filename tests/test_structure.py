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


def test_the_readme_names_the_command_ci_runs() -> None:
    """CI runs .ci/run; a reader of the README must be able to run the same check by hand."""
    script = (README.parent / ".ci" / "run").read_text().splitlines()
    commands = [line.strip() for line in script if line.strip() and not line.lstrip().startswith("#")]
    command = commands[-1]  # the script's last command is the check; the lines before it set the shell up
    assert command.startswith("make "), command
    lines = [line for line in README.read_text().splitlines() if ".ci/run" in line and command in line]
    assert lines, f"no README line names .ci/run with {command!r}"


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
