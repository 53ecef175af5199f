"""The pairing rules the engine checks (engine/pairing.py's parse_strategies), said in JSON Schema for the OpenAPI
document: a chain of strategy names is a list of known names, each at most once, the fuzzy one with or without a
threshold above 0 and at most 1. A client generated from the document never sends a chain the server refuses."""

from __future__ import annotations

from typing import Any

from tensor_debugger.engine.pairing import STRATEGIES

_PLAIN = "|".join(s for s in STRATEGIES if s != "fuzzy")
_THRESHOLD = r"(0?\.[0-9]*[1-9][0-9]*|1(\.0*)?)"  # above 0, at most 1, as engine/fuzzy.py's parse_threshold
STRATEGY_PATTERN = rf"^({_PLAIN}|fuzzy(:{_THRESHOLD})?)$"
STRATEGY_DESCRIPTION = (
    "the chain of pairing strategies, in order, each named at most once (fuzzy with or without a threshold, "
    '"fuzzy:0.8"); []: the default chain'
)


def chain_rules() -> dict[str, Any]:
    """What a list of strategy names must hold: known names, no name twice, and fuzzy (however its threshold is
    written) at most once."""
    return {
        "items": {"type": "string", "pattern": STRATEGY_PATTERN},
        "uniqueItems": True,
        "contains": {"type": "string", "pattern": "^fuzzy"},
        "minContains": 0,
        "maxContains": 1,
    }


def chain_schema() -> dict[str, Any]:
    """The whole chain as a JSON Schema object (for a body whose schema is written by hand)."""
    return {
        "type": "array",
        "maxItems": len(STRATEGIES),
        "description": STRATEGY_DESCRIPTION,
        **chain_rules(),
    }
