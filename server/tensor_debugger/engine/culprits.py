"""Name the module that introduced an error, not just the first one that carries it.

Each tensor of a traced module is an input or an output of that module. Its error is the relative RMSE of the
candidate against the reference, ||b - a|| / ||a|| over every element (0 when identical, infinite when the
reference is all zeros but the candidate is not, or when a NaN appears on one side only). A module's input error is
the largest error among its inputs, its output error the largest among its outputs, and the error it *adds* is
output error minus input error: a module that merely passes on an error it was given adds about nothing, the one
that creates it adds it all. Modules with both an input and an output pair are ranked by added error, largest first;
on a tie the deeper module (the more specific one, a projection rather than the block holding it) comes first.

Ranking is not naming: every stage of a run in another precision (fp32 against bf16) adds a little rounding error,
and one of them always adds the most. A module or stage is named a *culprit* only where its added error stands out
(`stands_out`): from the others' added errors, or from what a noise floor (a rerun of the reference) predicts.
Where nothing stands out the error grows evenly through the run, as a change of precision or of kernels makes it;
with fewer than RANKED_ENOUGH ranked there is no such "others" to stand out from (with one or two the median is at
least half the largest, so nothing can exceed STANDS_OUT times it), and that is said instead. One rule does not
lean on the others, and with so few it names the culprit: a module or stage whose compared inputs are bit-identical
(input error 0) and whose output fails made its error itself (`own`). With more ranked the median rule alone names
culprits: where every stage rounds (fp32 against bf16) the whole model's module, given token ids, would otherwise be
named for the rounding it carries out.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

# How far a culprit's added error stands out: more than STANDS_OUT times the median |added error| of every ranked
# module or stage of the run. Measured on a tiny Llama (2 and 4 layers, 12 seeds, stage dumps) run in fp32 against
# bf16, where every stage rounds: among stages that pass GROWTH below, the largest added error is at most 5.2x that
# median; with a 5% bug planted in one stage of the bf16 run (o_proj, q_proj, v_proj, up_proj or down_proj), the
# bug's stage adds at least 8.0x it (Hugging Face traces of the same model, 3 seeds: at most 5.4x, at least 51x). 7 sits
# between them.
STANDS_OUT = 7.0
# ...and more than GROWTH times the error it was given (its error at least triples across it): a stage after the
# bug amplifies the error it carries (the MLP after a 5% o_proj bug adds 0.5x its input) without creating it.
GROWTH = 2.0
# ...and more than this relative RMSE at all: fp32 rounding differences (another reduction order) stay below it.
MIN_ADDED_ERROR = 1e-5
# The fewest ranked modules or stages whose median says what is typical: with two, the median is half the sum.
RANKED_ENOUGH = 3


@dataclass(frozen=True)
class TensorError:
    module_path: str
    place: str  # "inputs_..." or "outputs..."
    position: int  # execution order of the pair
    error: float  # relative RMSE, see the module docstring


@dataclass(frozen=True)
class Culprit:
    module_path: str
    added_error: float
    input_error: float
    output_error: float
    position: int  # of the module's first output: where, in execution order, the error appears

    @property
    def depth(self) -> int:
        return self.module_path.count(".")


def relative_rmse(snr_db: float, nan_one_side: int = 0) -> float:
    """||b - a|| / ||a|| from the signal-to-noise ratio 10 log10(||a||^2 / ||b - a||^2)."""
    if nan_one_side or math.isnan(snr_db):
        return math.inf
    if snr_db == math.inf:
        return 0.0
    if snr_db == -math.inf:
        return math.inf
    return float(10.0 ** (-snr_db / 20.0))


def added_error(input_error: float, output_error: float) -> float:
    """Output error minus input error; an infinite error carried in and out adds nothing."""
    if math.isinf(output_error) and math.isinf(input_error):
        return 0.0
    return output_error - input_error


def stands_out(
    added: Sequence[float],
    inputs: Sequence[float],
    floors: Sequence[float | None] = (),
    factor: float = 4.0,
    own: Sequence[bool] = (),
) -> list[bool]:
    """Which of a run's ranked modules or stages are culprits: `added[i]` the error each added, `inputs[i]` the error
    it was given (relative RMSE); `floors[i]`, where a noise floor is known, the relative RMSE of the reference
    against its rerun at its output.

    A culprit adds more than MIN_ADDED_ERROR, more than GROWTH times its input error, and either more than `factor`
    times its noise floor (where the floor is known and not zero) or else more than STANDS_OUT times the median
    |added error| of all of them. An error that appears from nowhere (infinite, a NaN on one side) always stands out.
    `own[i]`: its inputs were compared and are bit-identical (input error 0) and its output fails: with fewer than
    RANKED_ENOUGH ranked (no median says what is typical) and no floor known, it stands out by itself.
    """
    finite = [abs(a) for a in added if math.isfinite(a)]
    typical = statistics.median(finite) if finite else 0.0
    few = len(added) < RANKED_ENOUGH
    marked = []
    for i, (gained, given) in enumerate(zip(added, inputs, strict=True)):
        floor = floors[i] if i < len(floors) else None
        if floor is not None and math.isfinite(floor) and floor > 0:
            beyond = gained > factor * floor
        else:
            beyond = gained > STANDS_OUT * typical or (few and i < len(own) and own[i] and given == 0.0)
        marked.append(bool(beyond and gained > MIN_ADDED_ERROR and gained > GROWTH * given))
    return marked


def rank_culprits(errors: list[TensorError]) -> list[Culprit]:
    """Modules with at least one input and one output error, by added error, largest first."""
    inputs: dict[str, float] = {}
    outputs: dict[str, tuple[float, int]] = {}
    for e in errors:
        if e.place.startswith("inputs"):
            inputs[e.module_path] = max(inputs.get(e.module_path, 0.0), e.error)
        elif e.place.startswith("outputs"):
            worst, first = outputs.get(e.module_path, (0.0, e.position))
            outputs[e.module_path] = (max(worst, e.error), min(first, e.position))
    culprits = [
        Culprit(path, added_error(inputs[path], out), inputs[path], out, position)
        for path, (out, position) in outputs.items()
        if path in inputs
    ]
    culprits.sort(key=lambda c: (-c.added_error, -c.depth, c.position))
    return culprits


@dataclass(frozen=True)
class StageCulprit:
    """A stage of a plain dump (no module traces) and the error it adds: its relative RMSE minus that of the
    tensor before it in execution order (within its layer, or the last of the layer before for a layer's first)."""

    position: int
    previous: int | None  # the position of the tensor before it; None for the first
    added_error: float
    input_error: float
    output_error: float


def rank_stages(errors: list[tuple[int, float]]) -> list[StageCulprit]:
    """Stages by the error they add, largest first (on a tie, the earlier): `errors` holds each compared tensor's
    (execution position, relative RMSE) in execution order; every one is ranked, those that lower it too."""
    ranked: list[StageCulprit] = []
    previous: tuple[int, float] | None = None
    for position, error in errors:
        before = previous[1] if previous is not None else 0.0
        added = added_error(before, error)
        ranked.append(StageCulprit(position, previous[0] if previous else None, added, before, error))
        previous = (position, error)
    ranked.sort(key=lambda c: (-c.added_error, c.position))
    return ranked
