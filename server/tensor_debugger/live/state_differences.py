"""The parameters and buffers of the module that made the first divergence, compared between the two models by
name (`find_divergence`). They are set outside the forward (a rotary's `inv_freq` made in `__init__` from another
base, an embedding scale, a weight loaded under the wrong key), so no recorded op made them: op capture names the
first op that reads one, and only the models themselves hold what it read.

A name both modules hold, with one shape on both sides, is compared: the reference's value cast to the candidate's
dtype against the candidate's, exactly (a bfloat16 port of a float32 model holds the reference's weights rounded,
which is no difference). Names one side lacks, or of another shape (a port that fuses q, k and v), are not compared,
and nothing is said of them."""

from __future__ import annotations

from dataclasses import dataclass

import torch

_BLOCK = 1 << 22  # elements compared at a time: a float64 difference of 32 MiB, whatever the tensor's size
LISTED = 5  # differences kept, in the module's order


@dataclass(frozen=True)
class StateDifference:
    name: str  # the parameter's or buffer's name inside the module ("inv_freq", "q_proj.weight")
    kind: str  # "parameter" or "buffer"
    max_abs_diff: float  # inf where one side holds a NaN or inf the other does not
    argmax: tuple[int, ...]  # the index of the largest |diff|
    mismatched: int  # elements that differ
    numel: int

    def words(self) -> str:
        return (
            f"{self.name} (a {self.kind}, max |diff| {self.max_abs_diff:.4g} at {list(self.argmax)}, "
            f"{self.mismatched} of {self.numel} elements differ)"
        )


def differing_state(
    reference: torch.nn.Module, candidate: torch.nn.Module, reference_path: str, candidate_path: str
) -> tuple[StateDifference, ...]:
    """The parameters and buffers of the reference's submodule `reference_path` ("" for the model itself) that
    differ from those of one name and shape in the candidate's `candidate_path`, the first `LISTED` in the
    reference module's order; () where either path names no submodule."""
    try:
        ours, theirs = reference.get_submodule(reference_path), candidate.get_submodule(candidate_path)
    except AttributeError:
        return ()
    found: list[StateDifference] = []
    for kind, mine, others in (
        ("parameter", dict(ours.named_parameters()), dict(theirs.named_parameters())),
        ("buffer", dict(ours.named_buffers()), dict(theirs.named_buffers())),
    ):
        for name, value in mine.items():
            other = others.get(name)
            if other is None or other.shape != value.shape:
                continue
            difference = _difference(name, kind, value, other)
            if difference is not None:
                found.append(difference)
                if len(found) == LISTED:
                    return tuple(found)
    return tuple(found)


def _difference(name: str, kind: str, value: torch.Tensor, other: torch.Tensor) -> StateDifference | None:
    """How `other` differs from `value` cast to its dtype, block by block on the CPU; None where they are equal
    (NaN where both hold NaN counts as equal)."""
    with torch.no_grad():
        a = value.detach().reshape(-1)
        b = other.detach().reshape(-1)
        worst, at, mismatched = 0.0, -1, 0
        for start in range(0, a.numel(), _BLOCK):
            x = a[start : start + _BLOCK].to(device="cpu", dtype=b.dtype)
            y = b[start : start + _BLOCK].to(device="cpu")
            if torch.equal(x, y):
                continue
            differ = x != y
            if x.is_floating_point() or x.is_complex():
                differ &= ~(x.isnan() & y.isnan())
            count = int(differ.sum())
            if not count:
                continue
            mismatched += count
            gap = (x.to(torch.float64) - y.to(torch.float64)).abs() if not x.is_complex() else (x - y).abs()
            gap = torch.where(differ, gap.nan_to_num(nan=float("inf")), torch.zeros((), dtype=gap.dtype))
            block_worst = float(gap.max())
            if block_worst > worst or at < 0:
                worst, at = block_worst, start + int(gap.argmax())
    if not mismatched:
        return None
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(at), value.shape)) if value.dim() else ()
    return StateDifference(name, kind, worst, index, mismatched, value.numel())


def state_words(module: str, other_module: str, differences: tuple[StateDifference, ...]) -> str:
    """The differences in words, naming the module on both sides (`module` the reference's call, `other_module` the
    candidate's)."""
    where = module if other_module.partition(".")[2] == module.partition(".")[2] else f"{module} ({other_module})"
    more = " (the first few)" if len(differences) == LISTED else ""
    return (
        f"in {where}, the candidate holds parameters or buffers that differ from the reference's of the same "
        f"name{more}: "
        f"{', '.join(d.words() for d in differences)}; they are set outside the forward (in `__init__`, or as the "
        "weights were loaded), so no recorded op made them"
    )
