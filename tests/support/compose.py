"""docker-compose.yml and the Dockerfile as Docker reads them, for the tests that check the stack."""

from __future__ import annotations

import functools
import shlex
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent.parent


@functools.cache
def services() -> dict[str, dict[str, Any]]:
    """docker-compose.yml's services, its YAML anchors and merge keys resolved."""
    compose: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    return dict(compose["services"])


def command_words(value: Any) -> list[str]:
    """A service's `command` (a list or a shell string) as its words."""
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, list) else shlex.split(str(value))
