"""Jinja filters for numbers, sizes and shapes, so templates hold no formatting logic."""

from __future__ import annotations

import html
import math
import re
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any, Protocol


class Templates(Protocol):
    """A template environment (a jinja2.Environment, which this module does not import: the CLI's `compare`
    formats numbers with these without loading Jinja, and reports know nothing of the web)."""

    @property
    def filters(self) -> MutableMapping[str, Any]: ...

    @property
    def globals(self) -> MutableMapping[str, Any]: ...


def format_number(value: float | None) -> str:
    """One format for every number shown: 4 significant digits, no trailing zeros, scientific notation only
    outside 1e-3 <= |value| < 1e4 (`1.3e-06` is written `1.3e-6`)."""
    if value is None:
        return "—"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value) or math.isinf(value):
        return str(value)
    if value == 0:
        return "0"
    fixed = f"{value:.4g}"
    if 1e-3 <= abs(float(fixed)) < 1e4 and "e" not in fixed:
        return fixed
    mantissa, exponent = f"{value:.3e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(exponent)}"


def format_cosine(value: object) -> str:
    """A cosine similarity; one that would read as a bare 1 but is not exactly 1 is shown as `1 − x` (x = 1 − cos),
    so a failing pair never reads as perfectly similar."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        text = format_number(float(value))
        if text == "1" and value != 1:
            return f"1 − {format_number(1 - float(value))}"
        return text
    return format_stat(value)


def format_fraction(value: object) -> str:
    """A fraction in [0, 1] as a percentage with up to 3 significant digits."""
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return format_stat(value)
    return f"{100 * value:.3g}%"


def format_stat(value: object) -> str:
    """A statistic from the API: numbers formatted, "nan"/"inf" shown as NaN/Inf so they stand out, nothing
    while it is not computed yet."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return ""
    if isinstance(value, str):
        return {"nan": "NaN", "inf": "Inf", "-inf": "-Inf"}.get(value, value)
    return format_number(value)


def format_error(value: object) -> str:
    """A relative error (3 significant digits); "inf" from the API as Inf."""
    if isinstance(value, str):
        return format_stat(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return ""
    return f"{value:.3g}"


def format_percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.3g}%" if whole else "—"


def format_bytes(value: int) -> str:
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def format_shape(shape: list[Any]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def anchor_id(name: str) -> str:
    """A tensor's name as a page anchor's id (letters, digits, _ and -)."""
    return re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-") or "tensor"


def format_where(where: Sequence[Any] | None) -> str:
    """Where inside a pair its error is, in words: "in heads 5, tokens 10-12" (each dimension by its name, else
    "dim D"; several ranges, or a dimension without a name, in brackets: "dim 2 [3-4, 10-12]"); "everywhere"
    where no dimension confines it; "" where it is not known (a passing pair). Entries are `where` items: dicts
    or objects with `dim`, `name` and `ranges`."""
    if where is None:
        return ""
    if not where:
        return "everywhere (no dimension confines it)"
    parts = []
    for entry in where:
        item = entry if isinstance(entry, Mapping) else vars(entry)
        spans = ", ".join(str(s) if s == e else f"{s}-{e}" for s, e in item["ranges"])
        name = item.get("name")
        if name and len(item["ranges"]) == 1:
            parts.append(f"{name} {spans}")
        else:
            label = name or f"dim {item['dim']}"
            parts.append(f"{label} [{spans}]")
    return "in " + ", ".join(parts)


def code_spans(text: str) -> str:
    """A sentence as the CLI prints it (`names` in backticks), as HTML for a page (the template marks it safe):
    escaped, each `name` in a <code>, its first letter a capital (the CLI's sentences start lower case)."""
    sentence = text[:1].upper() + text[1:] if not text.startswith("`") else text
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(sentence))


def register_filters(env: Templates) -> None:
    env.filters["code_spans"] = code_spans
    env.filters["gap_id"] = anchor_id
    env.filters["num"] = format_number
    env.filters["bytes"] = format_bytes
    env.filters["shape"] = format_shape
    env.filters["stat"] = format_stat
    env.filters["error"] = format_error
    env.filters["cosine"] = format_cosine
    env.filters["fraction"] = format_fraction
    env.filters["replica_words"] = replica_words
    env.filters["where"] = format_where
    env.filters["source"] = format_source
    env.globals["source_words"] = source_words
    env.globals["percent"] = format_percent


def replica_words(side: str, differing: list[int] | None) -> str:
    """Whose copies differ: "rank 1's replica", "ranks 1 and 3's replicas" (the candidate's, side "b"), "the
    reference's rank 0's replica"; "" where none is known to differ."""
    if not differing:
        return ""
    who = "" if side == "b" else "the reference's "
    if len(differing) == 1:
        return f"{who}rank {differing[0]}'s replica"
    return f"{who}ranks {', '.join(str(r) for r in differing[:-1])} and {differing[-1]}'s replicas"


def format_source(source: str | None) -> str:
    """A captured op's caller as shown: the file's name and the line ("/src/modeling_llama.py:412" ->
    "modeling_llama.py:412"); "—" where not known."""
    if not source:
        return "—"
    return source.replace("\\", "/").rsplit("/", 1)[-1]


def source_words(reference: str | None, candidate: str | None, place: str | None = None) -> str:
    """Where the two implementations called a captured op: "at modeling_llama.py:412 in the reference, my_port.py:88
    in the candidate"; for a module's input (`place` "inputs..."), the lines that passed it: "passed at ..."; ""
    where neither side is known."""
    if not reference and not candidate:
        return ""
    passed = "passed " if (place or "").startswith("inputs") else ""
    return f"{passed}at {format_source(reference)} in the reference, {format_source(candidate)} in the candidate"
