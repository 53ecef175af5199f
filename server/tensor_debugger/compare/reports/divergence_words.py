"""What lies before a first divergence, in the words every surface says it with: `find_divergence`'s answer
(live/divergence_answer.py), the CLI's `compare` (cli/compare_output.py) and the session page (web/templates/
_verdict.html, through the session's `FirstDivergence`)."""

from __future__ import annotations

from collections.abc import Sequence

from tensor_debugger.compare.reports.compare_report import CrossedOps, LoweredFirst

LISTED = 5  # the pairs of crossed ops named in words, the first

# why a module's output of another shape on each side is the first divergence, and the session's verdict
# "diverged", though no element of it was compared (compare/reports/reshaped.py), after its two shapes
RESHAPED_WHY = (
    "its inputs were compared and agree, and each side calls it as often, so the runs diverge here (the session's "
    "verdict: diverged), though it could not be compared as a whole"
)


def _at(name: str, source: str) -> str:
    return f"{name} ({source})" if source else name


def crossed_words(crossed: Sequence[CrossedOps]) -> str:
    """The ops paired by content across call indices before a first divergence, as one sentence ("" where none)."""
    if not crossed:
        return ""
    shown = [
        f"the candidate's {_at(c.candidate, c.candidate_source)} holds what the reference's "
        f"{_at(c.reference, c.reference_source)} holds"
        for c in crossed[:LISTED]
    ]
    more = f"; and {len(crossed) - LISTED} more" if len(crossed) > LISTED else ""
    return (
        f"Before it in its module call, ops paired by content across call indices: {'; '.join(shown)}{more}: the two "
        "sides make them in another order, or use each other's where the other does (halves swapped?), which may be "
        "where it began."
    )


def lowered_clause(first: LoweredFirst) -> str:
    """Where the candidate's lower precision begins, as the clause both the answer and the session say."""
    return (
        f"from {_at(first.name, first.source)} on, the first of its recorded tensors in {first.dtype} where the "
        "reference's is not"
    )


def lowered_words(first: LoweredFirst | None) -> str:
    """`lowered_clause` as a sentence of its own, for a session ("" where none)."""
    if first is None:
        return ""
    return f"Where the candidate's lower precision begins: {lowered_clause(first)}."
