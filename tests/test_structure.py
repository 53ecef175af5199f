"""Dependency direction and documentation, checked by reading the code and the README."""

from __future__ import annotations

import ast
from pathlib import Path

from tensor_debugger.settings import setting_docs

PACKAGE = Path(__file__).resolve().parent.parent / "server" / "tensor_debugger"
README = Path(__file__).resolve().parent.parent / "README.md"

# The pure core: values, layouts and statistics. It must not know about the web, the database or the store.
PURE = ["dtypes.py", "chunking.py", "summary.py", "names.py",
        *(f"engine/{p.name}" for p in (PACKAGE / "engine").glob("*.py"))]
FORBIDDEN = ("litestar", "sqlalchemy", "alembic", "zarr", "jinja2", "uvicorn", "tensor_debugger.store",
             "tensor_debugger.models", "tensor_debugger.app", "tensor_debugger.controllers")


def imports_of(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_pure_core_imports_no_framework_database_or_store() -> None:
    for name in PURE:
        bad = {i for i in imports_of(PACKAGE / name) if i.startswith(FORBIDDEN)}
        assert not bad, f"{name} imports {sorted(bad)}"


def test_storage_layer_does_not_import_the_web() -> None:
    for name in ("store.py", "database.py", "ingest.py", "catalog.py", "archive.py", "tensor_files.py"):
        bad = {i for i in imports_of(PACKAGE / name) if i.startswith(("litestar", "jinja2", "uvicorn"))}
        assert not bad, f"{name} imports {sorted(bad)}"


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
