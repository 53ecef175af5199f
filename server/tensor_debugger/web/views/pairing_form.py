"""The session page's pairing controls: the chain of strategies as a comma list with the fuzzy threshold in a
field of its own, the name pattern, and the hand-pairing's choice of alignment."""

from __future__ import annotations

from dataclasses import dataclass

from tensor_debugger.engine.pairing import DEFAULT_STRATEGIES, STRATEGIES
from tensor_debugger.errors import InvalidInputError


@dataclass(frozen=True)
class PairingForm:
    """What the form shows: the session's rules, or what the user typed when they were refused."""

    strategies: str  # "layer_stage, name, fuzzy"; "" for the default chain
    threshold: str  # the fuzzy threshold; "" for fuzzy's default
    name_pattern: str
    error: str | None = None
    known: str = ", ".join(STRATEGIES)
    default: str = ", ".join(DEFAULT_STRATEGIES)

    @classmethod
    def of(cls, strategies: list[str] | None, name_pattern: str | None) -> PairingForm:
        names, threshold = [], ""
        for item in strategies or ():
            base, _, value = str(item).partition(":")
            names.append(base)
            if base == "fuzzy" and value:
                threshold = value
        return cls(", ".join(names), threshold, name_pattern or "")

    @classmethod
    def typed(cls, fields: dict[str, str], error: str) -> PairingForm:
        return cls(fields.get("strategies", ""), fields.get("threshold", ""), fields.get("name_pattern", ""), error)


def rules_from_form(fields: dict[str, str]) -> tuple[str, str]:
    """(strategies as the CLI takes them, name pattern) from the form: the threshold joins fuzzy ("fuzzy:0.8").
    The chain itself is checked by the action, as the CLI checks it."""
    chain = [part.strip() for part in fields.get("strategies", "").split(",") if part.strip()]
    threshold = fields.get("threshold", "").strip()
    if threshold:
        if not chain:
            chain = list(DEFAULT_STRATEGIES)
        if "fuzzy" not in chain:
            raise InvalidInputError("a fuzzy threshold needs fuzzy in the chain of strategies")
        chain = [f"fuzzy:{threshold}" if item == "fuzzy" else item for item in chain]
    return ",".join(chain), fields.get("name_pattern", "").strip()
