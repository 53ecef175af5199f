"""The buffers of the models `find_divergence` calls, as it found them, put back before each later call and at the
end: each forward pass starts from the state the first started from, and the caller's models are left as given.

A model in training mode updates buffers as it runs (BatchNorm's running statistics and its `num_batches_tracked`
counter, `add_`'ed on each call): its second call then recorded another counter than its first, and the model was
refused as changing between calls though its outputs did not change; and each of find_divergence's passes moved the
running statistics the caller's model keeps. Parameters are not touched (no optimizer runs). The cost: a copy of
each model's buffers (rotary tables, masks, statistics: small beside its parameters), and copying them back before
each call after the first."""

from __future__ import annotations

import torch


class BufferStates:
    """The buffers of each model seen (by `before_call`), as they were before its first call."""

    def __init__(self) -> None:
        # model id -> (the model, [(its module, the buffer's name, the buffer, a copy of its values)])
        self._kept: dict[
            int, tuple[torch.nn.Module, list[tuple[torch.nn.Module, str, torch.Tensor, torch.Tensor]]]
        ] = {}

    def before_call(self, model: torch.nn.Module) -> None:
        """Keeps `model`'s buffers before its first call; before each later call, puts them back."""
        if id(model) in self._kept:
            self._restore(self._kept[id(model)][1])
            return
        held = []
        seen: set[int] = set()
        for module in model.modules():
            for name, buffer in module.named_buffers(recurse=False):
                if id(buffer) not in seen:
                    seen.add(id(buffer))
                    held.append((module, name, buffer, buffer.detach().clone()))
        self._kept[id(model)] = (model, held)

    def restore_all(self) -> None:
        """Puts back every model's buffers as they were before its first call."""
        for _, held in self._kept.values():
            self._restore(held)

    @staticmethod
    def _restore(held: list[tuple[torch.nn.Module, str, torch.Tensor, torch.Tensor]]) -> None:
        with torch.no_grad():
            for module, name, buffer, values in held:
                setattr(module, name, buffer)  # a buffer the call replaced (a table rebuilt longer) is the old one
                try:
                    buffer.copy_(values)
                except RuntimeError:  # an inference tensor, written outside inference mode: its copy takes its place
                    setattr(module, name, values.clone())
