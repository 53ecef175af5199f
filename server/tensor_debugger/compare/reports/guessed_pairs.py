"""Pairs whose partner was guessed: paired by a unique shape or by a fuzzy name (`engine/pairing`'s last strategies
in the default chain), not by names that say they hold one value. A guessed pair that fails is still reported where
it falls in execution order (a right guess, `attn` against `attention`, is a real divergence), but every line that
names it as the first divergence or a culprit names the strategy and the candidate's tensor, so the user can check
the guess."""

from __future__ import annotations

# the strategies that pair without a name saying the two tensors hold one value (store/reports.py's PairingStrategy
# SHAPE and FUZZY, said here as their text: the CLI's output imports this module, and the store's ORM models, which
# that module imports, are no import of a command answered from a server or the kept answers: tests/cli/test_warm.py)
GUESSING = frozenset({"shape", "fuzzy"})


def guessed_by(strategy: str) -> str | None:
    """A pair's strategy text (`shape`, `fuzzy 0.86`) where it guessed the partner; None where names, module paths,
    parameters or the user paired it."""
    return strategy if strategy.split(" ", 1)[0] in GUESSING else None


def guess_words(paired_by: str | None, candidate_name: str | None) -> str | None:
    """`paired by shape with the candidate's 0_rotary_cos: a guess`, or None where the partner was not guessed."""
    if paired_by is None or candidate_name is None:
        return None
    return f"paired by {paired_by} with the candidate's {candidate_name}: a guess"
