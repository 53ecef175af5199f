"""Every third-party module the code imports comes from a distribution pyproject.toml declares: the package's own
code and its migrations from [project.dependencies], the build hook from [build-system.requires], the tests and the
benchmarks from those plus the `test` extra. A module that is only there because something else pulls it in (anyio
through litestar, say) breaks the day that something stops pulling it, and the lowest-versions run
(`make test-lowest`) cannot check a bound that is not declared."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from collections.abc import Iterable, Mapping
from functools import cache
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
BUILD_HOOK = REPO / "server" / "build_hooks.py"


def canonical(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_names(requirements: Iterable[str]) -> set[str]:
    names: set[str] = set()
    for requirement in requirements:
        found = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
        assert found is not None, requirement
        names.add(canonical(found.group(1)))
    return names


RUNTIME = requirement_names(PYPROJECT["project"]["dependencies"])
TEST = RUNTIME | requirement_names(PYPROJECT["project"]["optional-dependencies"]["test"])
BUILD = requirement_names(PYPROJECT["build-system"]["requires"])


@cache
def providers() -> Mapping[str, list[str]]:
    """Top-level module -> the installed distributions that provide it (reading every RECORD takes a while)."""
    return metadata.packages_distributions()


def imported_modules(path: Path) -> set[str]:
    """Top-level names of the absolute imports in one file, wherever they stand (functions and TYPE_CHECKING too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            names.add(node.module.partition(".")[0])
    return names


def is_local(module: str, path: Path) -> bool:
    """The project's own code: its package and tests, or a module beside the importing script (bench/harness.py)."""
    return any(
        (folder / module).is_dir() or (folder / f"{module}.py").is_file()
        for folder in (REPO, REPO / "server", path.parent)
    )


def undeclared(files: Iterable[Path], declared: set[str]) -> list[str]:
    """'file: module (distribution)' for each third-party import that no declared distribution provides."""
    problems: list[str] = []
    for path in sorted(files):
        for module in sorted(imported_modules(path)):
            if module in sys.stdlib_module_names or module == "__future__" or is_local(module, path):
                continue
            distributions = {canonical(d) for d in providers().get(module, [])}
            if not distributions & declared:
                found = ", ".join(sorted(distributions)) or "not installed"
                problems.append(f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}: {module} ({found})")
    return problems


def python_files(*folders: str) -> list[Path]:
    files = [path for folder in folders for path in (REPO / folder).rglob("*.py")]
    assert files, folders
    return files


def test_the_package_and_its_migrations_import_only_runtime_dependencies() -> None:
    files = [path for path in python_files("server", "migrations") if path != BUILD_HOOK]
    assert undeclared(files, RUNTIME) == []


def test_the_build_hook_imports_only_build_requirements() -> None:
    assert undeclared([BUILD_HOOK], BUILD) == []


def test_tests_and_benchmarks_import_only_runtime_and_test_dependencies() -> None:
    assert undeclared(python_files("tests", "bench"), TEST) == []


def test_the_check_sees_an_undeclared_import(tmp_path: Path) -> None:
    """The check itself: anyio is installed (litestar needs it), json is stdlib, the last name is nowhere."""
    script = tmp_path / "script.py"
    script.write_text("import json\nfrom anyio import to_thread\n\ndef f() -> None:\n    import no_such_module_here\n")
    missing = f"{script}: no_such_module_here (not installed)"
    assert undeclared([script], {"numpy"}) == [f"{script}: anyio (anyio)", missing]
    assert undeclared([script], {"anyio"}) == [missing]


def lowest_pins() -> list[str]:
    """`name==bound` for each declared requirement but torch (those of every extra too), from its `>=` bound: what
    constraints-lowest.txt holds."""
    pins: set[str] = set()
    project = PYPROJECT["project"]
    extras = [r for requirements in project["optional-dependencies"].values() for r in requirements]
    for requirement in [*project["dependencies"], *extras]:
        name = requirement_names([requirement]).pop()
        if name == "torch":  # the Makefile installs the CPU wheel on disk first; a resolver must never pick one
            continue
        bound = re.search(r">=\s*([^,;\s]+)", requirement)
        assert bound is not None, f"{requirement!r} has no lower bound for `make test-lowest` to try"
        pins.add(f"{name}=={bound.group(1)}")
    return sorted(pins)


def test_the_lowest_constraints_are_the_declared_lower_bounds() -> None:
    """`make test-lowest` installs constraints-lowest.txt: it must pin exactly pyproject.toml's lower bounds, so a
    bound cannot be raised or added (a new dependency) without the lowest run trying it."""
    lines = (REPO / "constraints-lowest.txt").read_text().splitlines()
    pins = sorted(line for line in lines if line.strip() and not line.startswith("#"))
    assert pins == lowest_pins(), "constraints-lowest.txt should pin:\n" + "\n".join(lowest_pins())
