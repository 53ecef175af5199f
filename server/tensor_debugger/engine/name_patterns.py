"""A user's name pattern: a regular expression whose named groups give a stored tensor's layer, stage and
rank where its name does not."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import replace

from tensor_debugger.engine.logical_tensors import TensorRef


def apply_name_pattern(tensors: Iterable[TensorRef], pattern: re.Pattern[str] | None) -> list[TensorRef]:
    """Layer and stage from the pattern's `layer` and `stage` groups where it matches a name (the parsed ones
    elsewhere)."""
    if pattern is None:
        return list(tensors)
    found: list[TensorRef] = []
    for tensor in tensors:
        match = pattern.search(tensor.name)
        if match is None:
            found.append(tensor)
            continue
        groups = match.groupdict()
        layer_text, stage = groups.get("layer"), groups.get("stage")
        layer = int(layer_text) if layer_text is not None and layer_text.isdigit() else tensor.layer
        found.append(replace(tensor, layer=layer, stage=stage if stage else tensor.stage))
    return found


PATTERN_GROUPS = ("layer", "stage", "rank")


def compile_name_pattern(text: str | None) -> re.Pattern[str] | None:
    """A user's name pattern: a regular expression with named groups `layer` and `stage` (and optionally
    `rank`). Raises ValueError naming the problem."""
    if text is None or text == "":
        return None
    try:
        pattern = re.compile(text)
    except re.error as exc:
        raise ValueError(f"name pattern {text!r} is not a regular expression: {exc}") from None
    missing = [g for g in ("layer", "stage") if g not in pattern.groupindex]
    if missing:
        raise ValueError(
            f"name pattern {text!r} has no named group {' or '.join(repr(g) for g in missing)}: "
            f"write (?P<layer>\\d+) and (?P<stage>...)"
        )
    unknown = [g for g in pattern.groupindex if g not in PATTERN_GROUPS]
    if unknown:
        raise ValueError(
            f"name pattern {text!r} has a named group {unknown[0]!r}: only layer, stage and rank are understood"
        )
    return pattern
