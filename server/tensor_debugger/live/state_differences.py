"""The parameters and buffers of the module that made the first divergence, compared between the two models by
name (`find_divergence`). They are set outside the forward (a rotary's `inv_freq` made in `__init__` from another
base, an embedding scale, a weight loaded under the wrong key), so no recorded op made them: op capture names the
first op that reads one, and only the models themselves hold what it read.

A name both modules hold, with one shape and one kind of dtype (floating, complex, integer, bool) on both sides, is
compared: both cast to the less precise of the two dtypes, exactly (a bfloat16 port of a float32 model holds the
reference's weights rounded, which is no difference; nor is a float32 port of a bfloat16 reference loaded from the
float32 weights), integers as integers. The comparison runs on the candidate's device, copying only where the two
devices differ. A buffer both hold with another shape is a difference, said with its two shapes (a rotary's
`inv_freq` made in `__init__` for another partial rotary factor: not in the state dict, so no load refused it).
Names one side lacks, parameters of another shape (a port that fuses q, k and v, or gate and up: its own layout),
tensors of another kind of dtype, and tensors with no values to read (meta, sparse) are not compared, and nothing
is said of them."""

from __future__ import annotations

import math
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
    shape: tuple[int, ...] = ()  # the reference's, where the candidate's is another
    other_shape: tuple[int, ...] | None = None  # the candidate's, where it is another: nothing else is compared

    def words(self) -> str:
        if self.other_shape is not None:
            return f"{self.name} (a {self.kind} of shape {list(self.shape)}, {list(self.other_shape)} in the candidate)"
        return (
            f"{self.name} (a {self.kind}, max |diff| {self.max_abs_diff:.4g} at {list(self.argmax)}, "
            f"{self.mismatched} of {self.numel} elements differ)"
        )


def differing_state(
    reference: torch.nn.Module, candidate: torch.nn.Module, reference_path: str, candidate_path: str
) -> tuple[StateDifference, ...]:
    """The parameters and buffers of the reference's submodule `reference_path` ("" for the model itself) that
    differ from those of one name in the candidate's `candidate_path` (in values; buffers in shape too), the first
    `LISTED` in the reference module's order; () where either path names no submodule."""
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
            if other is None or (other.shape != value.shape and kind == "parameter"):
                continue
            difference: StateDifference | None = None
            if other.shape == value.shape:
                difference = _difference(name, kind, value, other)
            elif _squeezed(other.shape) == _squeezed(value.shape) and other.layout == torch.strided:
                # the same shape but for dimensions of size 1 (a rotary cache kept as [1, 1, seq, dim] for
                # [seq, dim]): compared as the reference's shape, said only where the values differ
                difference = _difference(name, kind, value, other.reshape(value.shape))
            else:
                shape, numel = tuple(value.shape), value.numel()
                difference = StateDifference(name, kind, math.inf, (), numel, numel, shape, tuple(other.shape))
            if difference is not None:
                found.append(difference)
                if len(found) == LISTED:
                    return tuple(found)
    return tuple(found)


def _squeezed(shape: torch.Size) -> tuple[int, ...]:
    """A shape without its dimensions of size 1."""
    return tuple(n for n in shape if n != 1)


def _kind(dtype: torch.dtype) -> str:
    return (
        "complex"
        if dtype.is_complex
        else "float"
        if dtype.is_floating_point
        else "bool"
        if dtype == torch.bool
        else "int"
    )


def _common(a: torch.dtype, b: torch.dtype) -> torch.dtype:
    """The less precise of two dtypes of one kind (the one with fewer significand bits, then fewer bytes)."""
    if a == b or _kind(a) in ("bool", "int"):
        return a if a == b else torch.promote_types(a, b)  # integers: the wider, no value lost
    bits = {d: (torch.finfo(d).eps, -torch.finfo(d).bits) for d in (a, b)} if _kind(a) == "float" else {}
    if bits:
        return max((a, b), key=lambda d: bits[d])  # the larger eps: the less precise
    return a if a.itemsize <= b.itemsize else b


def _difference(name: str, kind: str, value: torch.Tensor, other: torch.Tensor) -> StateDifference | None:
    """How `other` differs from `value`, both cast to their less precise dtype, block by block on `other`'s device;
    None where they are equal (NaN where both hold NaN counts as equal), of different kinds of dtype, or without
    values to read."""
    if _kind(value.dtype) != _kind(other.dtype) or any(t.is_meta or t.layout != torch.strided for t in (value, other)):
        return None
    dtype = _common(value.dtype, other.dtype)
    exact = _kind(dtype) in ("bool", "int")
    with torch.no_grad():
        a = value.detach().reshape(-1)
        b = other.detach().reshape(-1)
        worst, at, mismatched = 0.0, -1, 0
        for start in range(0, a.numel(), _BLOCK):
            x = a[start : start + _BLOCK].to(device=b.device, dtype=dtype)
            y = b[start : start + _BLOCK].to(dtype=dtype)
            if torch.equal(x, y):
                continue
            differ = x != y
            if not exact:
                differ &= ~(x.isnan() & y.isnan())
            count = int(differ.sum())
            if not count:
                continue
            mismatched += count
            if exact:  # integers as integers (int64 past 2**53 stays exact); bool as 0 and 1
                gap = (x.to(torch.int64) - y.to(torch.int64)).abs().to(torch.float64)
            elif x.is_complex():
                gap = (x.to(torch.complex128) - y.to(torch.complex128)).abs()
            else:
                gap = (x.to(torch.float64) - y.to(torch.float64)).abs()
            gap = torch.where(
                differ, gap.nan_to_num(nan=float("inf")), torch.zeros((), dtype=gap.dtype, device=gap.device)
            )
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
        f"{', '.join(d.words() for d in differences)}; no recorded op made them: they are set outside the forward "
        "(in `__init__`, or as the weights were loaded), or changed by it in place (running statistics)"
    )
