"""The summaries of the tensors a capture met, each computed once while its tensor is unchanged."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Sequence

import torch

from tensor_debugger.engine.summary_compare import Sketch
from tensor_debugger.ingest.sketches import fold64_sketch, reshaped


class Summaries:
    """Summaries (`sketches.fold64_sketch`: a "fold64" hash on every device) of the tensors met, each computed as its
    hook fires, on the caller's thread, so that a tensor met again unchanged (a module's output is its last op's, its
    input the previous module's output) is not read again: kept by the tensor object, with its version counter (which
    every in-place change of it or of a view of it advances) and a weak reference (so that no tensor is kept alive,
    and a new tensor at a freed one's address is not taken for it). Inference tensors (`torch.inference_mode`) have
    no version counter: theirs are computed every time.

    A CPU view of a tensor summarised (a `view`, `reshape`, `unsqueeze`, ... of it or of the same base) that starts
    at the same byte, has as many elements of the same dtype and reads them in the same steps (`_steps`: contiguous
    ones, or a strided q split from a fused projection and its view as heads) holds the same bytes in the same
    order: its summary is that tensor's with its own shape (`sketches.reshaped`: the same statistics and sample, the
    hash of the new shape from the same sum of words), while neither was changed in place (their version counter,
    shared, is the one the summary was made at)."""

    def __init__(self) -> None:
        self.known: dict[int, tuple[weakref.ref[torch.Tensor], int, Summary]] = {}
        # CPU tensors summarised, by (first byte's address, elements, dtype, steps: `_span`): the latest of each
        self.spans: dict[Span, tuple[weakref.ref[torch.Tensor], int, Summary]] = {}

    def sketch(self, tensor: torch.Tensor) -> Summary:
        key = id(tensor)
        try:
            version = tensor._version
        except RuntimeError:  # "Inference tensors do not track version counter"
            return fold64_sketch(tensor)
        known = self.known.get(key)
        if known is not None and known[0]() is tensor and known[1] == version:
            return known[2]
        span = _span(tensor)
        summary = self._alias(tensor, span, version) if span is not None else None
        summary = summary or fold64_sketch(tensor)
        ref = weakref.ref(tensor, functools.partial(self._forget, key, span))
        self.known[key] = (ref, version, summary)
        if span is not None:
            self.spans[span] = (ref, version, summary)
        return summary

    def _alias(self, tensor: torch.Tensor, span: Span, version: int) -> Summary | None:
        """The summary of `tensor` from that of a tensor of the same span and base, unchanged since (see the class
        docstring); None where there is none."""
        known = self.spans.get(span)
        other = known[0]() if known is not None else None
        if known is None or other is None or _root(other) is not _root(tensor) or known[1] != version:
            return None
        summary, total = known[2]
        if total is None:
            return None
        return reshaped(summary, total, tuple(tensor.shape), tensor.element_size()), total

    def _forget(self, key: int, span: Span | None, ref: weakref.ref[torch.Tensor]) -> None:
        known = self.known.get(key)
        if known is not None and known[0] is ref:
            del self.known[key]
        spanned = self.spans.get(span) if span is not None else None
        if span is not None and spanned is not None and spanned[0] is ref:
            del self.spans[span]


# A summary, and where the compiled kernel summed its "fold64" hash, that sum (`sketches.fold64_sketch`).
Summary = tuple[Sketch, int | None]
Span = tuple[int, int, torch.dtype, tuple[tuple[int, int], ...]]  # `_span`


def _span(tensor: torch.Tensor) -> Span | None:
    """A CPU tensor's (first byte's address, elements, dtype, the steps its elements are read in: `_steps`); None
    for any other, an empty one, or a lazy conjugate or negation (`x.H`, `x.conj()`: not the values its bytes hold)."""
    if tensor.device.type != "cpu" or tensor.numel() == 0 or tensor.is_conj() or tensor.is_neg():
        return None
    return (tensor.data_ptr(), tensor.numel(), tensor.dtype, _steps(tensor.shape, tensor.stride()))


def _steps(shape: Sequence[int], strides: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """The (size, stride) of each dimension with dimensions of size 1 left out and each dimension merged into the one
    before it where it continues it (stride before = size * stride): two tensors from the same first byte with the
    same steps read the same elements in the same order (a contiguous one's are `((numel, 1),)`; q split from a
    fused projection, (1, 256, 768) of stride 2304, and its view as heads, (1, 256, 12, 64), are one; transposed,
    not)."""
    steps: list[tuple[int, int]] = []
    for size, stride in zip(shape, strides, strict=True):
        if size == 1:
            continue
        if steps and steps[-1][1] == size * stride:
            steps[-1] = (steps[-1][0] * size, stride)
        else:
            steps.append((size, stride))
    return tuple(steps)


def _root(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor a view was made from (its storage's and version counter's owner), else the tensor itself."""
    base = tensor._base
    return base if base is not None else tensor
