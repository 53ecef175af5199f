"""docker-compose.yml and the Dockerfile as Docker reads them, for the tests that check the stack: the file's `${...}`
interpolated as Compose does, from the variables of `.env.example` (what a user copies to `.env`) unless told
others."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent.parent
# ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?error}, ${NAME?error}, $NAME; $$ is a literal $
_VARIABLE = re.compile(
    r"\$(?:(\$)"  # $$
    r"|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])((?:[^{}]|\{[^{}]*\})*))?\}"  # ${NAME...}
    r"|([A-Za-z_][A-Za-z0-9_]*))"  # $NAME
)


class MissingVariable(KeyError):
    """A `${NAME:?error}` whose variable is not set: Compose refuses to start, saying `error`."""


def env_example() -> dict[str, str]:
    """The variables `.env.example` sets, as Compose reads a `.env` file."""
    found = {}
    for line in (REPO / ".env.example").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            found[name.strip()] = value.strip()
    return found


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """`value` (a string, or lists and mappings of them) with its variables replaced as Compose replaces them."""
    if isinstance(value, dict):
        return {key: interpolate(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, env) for item in value]
    if not isinstance(value, str):
        return value

    def replace(match: re.Match[str]) -> str:
        dollar, name, operator, argument, bare = match.groups()
        if dollar:
            return "$"
        name = name or bare
        given = env.get(name)
        unset = given is None or (operator is not None and operator.startswith(":") and given == "")
        if operator in (":-", "-") and unset:
            return str(interpolate(argument, env))
        if operator in (":?", "?") and unset:
            raise MissingVariable(f"{name}: {argument}")
        return given or ""

    return _VARIABLE.sub(replace, value)


def raw_compose() -> dict[str, Any]:
    """docker-compose.yml's YAML, anchors and merge keys resolved, variables not."""
    loaded: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    return loaded


def services(env: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """docker-compose.yml's services, interpolated with `env` (default: `.env.example`'s variables)."""
    return dict(interpolate(raw_compose()["services"], env_example() if env is None else env))


def command_words(value: Any) -> list[str]:
    """A service's `command` (a list or a shell string) as its words."""
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, list) else shlex.split(str(value))
