"""What lies before a first divergence, in the words every surface says it with: `find_divergence`'s answer
(live/divergence_answer.py), the CLI's `compare` (cli/compare_output.py) and the session page (web/templates/
_verdict.html, through the session's `FirstDivergence`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from tensor_debugger.compare.reports.compare_report import (
    CrossedOps,
    HeldBefore,
    LoweredFirst,
    ModelCheck,
    RecordedEarly,
)
from tensor_debugger.engine.capture_order import module_of

if TYPE_CHECKING:  # the CLI's `compare` imports these words without numpy (engine/head_slices.py imports it)
    from tensor_debugger.engine.head_slices import HeadSlices, Slice

LISTED = 5  # the pairs of crossed ops named in words, the first; the tensors recorded early, the last


def tensors(count: int) -> str:
    """The word for `count` tensors: "tensor" for one, else "tensors"."""
    return "tensor" if count == 1 else "tensors"


# why a module's output of another shape on each side is the first divergence, and the session's verdict
# "diverged", though no element of it was compared (compare/reports/reshaped.py), after its two shapes
RESHAPED_WHY = (
    "its inputs were compared and agree, and each side calls it as often, so the runs diverge here (the session's "
    "verdict: diverged), though it could not be compared as a whole"
)

# what is known of a pair whose content hashes differ and whose summaries pass: not that it is within tolerance
SUMMARIES_FOUND_NOTHING = (
    "its summaries found nothing outside tolerance (they bound max |diff| from below: not every element compared)"
)


def changed_words(changed: str, on_summaries: bool, noise: bool = False) -> str:
    """The first tensor before a first divergence whose values differ at all (`changed`: its name and line), as the
    session says it: within tolerance (or `noise`: within the noise floor) where its values were compared, what its
    summaries found where only they were."""
    if on_summaries:
        return f"the first tensor whose values differ at all (content hashes) is {changed}; {SUMMARIES_FOUND_NOTHING}"
    within = "the noise floor" if noise else "tolerance"
    return f"the first tensor whose values differ at all is {changed}, within {within} there"


# where a first divergence was found and every one of the models' own outputs paired with a bit-identical one
OUTPUTS_AGREE = (
    "The models' own outputs are bit-identical (their content hashes are equal): what diverges here does not reach "
    "them (taken out again later, as by a second mask?)."
)

# where a first divergence was found and every one of the models' own outputs paired with one within tolerance by
# their summaries, but not every one bit-identical (a BatchNorm folded into the conv before it: the conv's outputs
# differ, the model's agree)
OUTPUTS_WITHIN = (
    "The models' own outputs agree within tolerance by their summaries (norms, means and sampled elements; not bit "
    "for bit, and not every element compared): what diverges here may not reach them beyond rounding (the same "
    "result computed another way, as a norm folded into the weights before it, or taken out again later?)."
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


def early_words(early: Sequence[RecordedEarly]) -> str:
    """The candidate's tensors recorded before a first divergence that pair with tensors the reference records only
    after it, as one sentence ("" where none): the last few, nearest the divergence, and their partners' lines."""
    if not early:
        return ""
    shown = early[-LISTED:]
    hidden = len(early) - len(shown)
    later = list(dict.fromkeys(e.reference_source for e in early if e.reference_source))[:LISTED]
    lines_later = f" ({', '.join(later)})" if later else ""
    return (
        f"Before it, the candidate recorded {f'{hidden} more {tensors(hidden)} and then ' if hidden else ''}"
        f"{', '.join(_at(e.candidate, e.candidate_source) for e in shown)}, which pair by name with tensors the "
        f"reference records only after it{lines_later}: the candidate ran them where the reference does not (a "
        "module called in another's place?), which may be where it began."
    )


def holds_words(held: HeldBefore | None) -> str:
    """What the candidate's tensor at a first divergence holds, where the reference recorded it before (`held`), as
    one sentence ("" where it did not)."""
    if held is None:
        return ""
    return (
        f"The candidate's {held.candidate} holds, bit for bit, what the reference's "
        f"{_at(held.reference, held.reference_source)} held before it: a step the reference takes after that one, the "
        "candidate did not take (or took elsewhere)."
    )


# the note find_divergence leaves on the candidate's run of full values it stores ("candidate (full)"): the session
# then holds the answer to what needs the models, and its first divergence does not send the user to find_divergence
FOUND_BY_FIND_DIVERGENCE = (
    "stored by find_divergence, which held both models and checked what needs them (the module called again on "
    "the reference's inputs to it, its parameters and buffers, the precision floor, where each applies): its answer "
    "says what it found"
)


def checks_words(name: str, checks: Sequence[ModelCheck], dtype: str | None = None) -> str:
    """What `find_divergence` can check of a session's first divergence `name` (a captured tensor) that the session
    cannot, as one sentence ("" where nothing applies); `dtype`, the candidate's lower precision, for the precision
    floor."""
    module = module_of(name)
    what = {
        ModelCheck.GROWN: f"whether {module} diverges by its own doing or by its inputs' difference within tolerance "
        "grown past it (it calls the candidate's module again on the reference's inputs to it)",
        ModelCheck.STATE: f"whether {module}'s parameters or buffers differ from the reference's (no capture stores "
        "them)",
        ModelCheck.FLOOR: f"whether the difference is beyond the rounding to {dtype or 'its lower precision'} (a "
        "precision floor: the reference run again in it)",
    }
    if not checks:
        return ""
    return (
        "What needs the two models, find_divergence(reference, candidate, inputs) can check, and this session "
        f"cannot: {'; '.join(what[c] for c in checks)}."
    )


def slices_words(
    module: str, found: HeadSlices, reference_lines: Mapping[str, str], candidate_lines: Mapping[str, str]
) -> str:
    """What relating the candidate's ops without partner in `module` to slices of the reference's tensors found
    (engine/head_slices.py), each tensor with its line where one is known: a relation found by values, said so."""
    checked = len(found.matched) + len(found.unrelated) + (found.first is not None)
    text = (
        f"Inside {module}, {checked} of the candidate's ops before it that paired with none of the reference's were "
        f"compared in order, by values, with {found.compared} slices of the reference's tensors of related shapes"
    )
    if found.matched:
        last = found.matched[-_SHOWN:]
        said = "; ".join(
            f"{_at(m.candidate, candidate_lines.get(m.candidate, ''))} equals {_slice_at(m.slice, reference_lines)}"
            for m in last
        )
        more = f"the last {len(last)}: " if len(found.matched) > len(last) else ""
        text += f": {len(found.matched)} equal one ({more}{said})"
    if found.unrelated:
        text += f"; {len(found.unrelated)} related to none by shape (not compared)"
    f = found.first
    if f is None:
        if found.cut:
            return (
                text
                + "; none of those checked differs, but the comparisons' budget ran out before every op was checked."
            )
        return text + "; none of them differs."
    op = _at(f.candidate, candidate_lines.get(f.candidate, ""))
    if f.layout and f.slice is not None:
        return (
            text + f". The first taken another way is {op}: it equals {_slice_at(f.slice, reference_lines)}, a "
            "slice of a layout none of the earlier ops of its function and shape equal (a strided slice where "
            "they took blocks, or another dimension?). The divergence may begin there."
        )
    if f.due is not None and f.slice is not None:
        return (
            text + f". The first out of turn is {op}: it equals {_slice_at(f.slice, reference_lines)}, where part "
            f"{f.due} was due after the ops of its kind before it: a slice taken for another part? The divergence "
            "may begin there."
        )
    nearest = (
        f" (the nearest: {_slice_at(f.slice, reference_lines)}, max |diff| {f.max_abs_diff:.4g})"
        if f.slice is not None and f.max_abs_diff is not None
        else ""
    )
    return text + f". The first that equals none of them is {op}{nearest}: the divergence may begin there."


_SHOWN = 3  # the candidate's ops equal to a slice named in words, the last before the first that is not


def _slice_at(piece: Slice, lines: Mapping[str, str]) -> str:
    at = lines.get(piece.reference, "")
    return f"the reference's {piece.words()}" + (f" (made at {at})" if at else "")
