"""Name the module that introduced an error, not just the first one that carries it.

Each tensor of a traced module is an input or an output of that module. Its error is the relative RMSE of the
candidate against the reference, ||b - a|| / ||a|| over every element (0 when identical, infinite when the
reference is all zeros but the candidate is not, or when a NaN appears on one side only). A module's input error is
the largest error among its inputs, its output error the largest among its outputs, and the error it *adds* is
output error minus input error: a module that merely passes on an error it was given adds about nothing, the one
that creates it adds it all. Modules with both an input and an output pair are ranked by added error, largest first;
on a tie the deeper module (the more specific one, a projection rather than the block holding it) comes first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


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
    (execution position, relative RMSE) in execution order; only those that add some error are ranked."""
    ranked: list[StageCulprit] = []
    previous: tuple[int, float] | None = None
    for position, error in errors:
        before = previous[1] if previous is not None else 0.0
        added = added_error(before, error)
        if added > 0:
            ranked.append(StageCulprit(position, previous[0] if previous else None, added, before, error))
        previous = (position, error)
    ranked.sort(key=lambda c: (-c.added_error, c.position))
    return ranked
