"""The hooks a capture puts on a model's modules (forward, and with backward=True the gradients)."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import torch

from tensor_debugger.live.call_recorder import Recorder, Scope
from tensor_debugger.live.capture_types import Level
from tensor_debugger.live.module_names import aliases

_F = TypeVar("_F", bound=Callable[..., Any])


def _eager(hook: _F) -> _F:
    """`hook`, run as it is where torch.compile meets it (between its graphs, on real tensors), never traced.

    `torch.compiler.disable` imports torch._dynamo (about 1.5 s of CPU the first time, most of a plain model's first
    capture); where torch.compile has not been used in this process (torch._dynamo not imported: no module of the
    model compiled, wrapped or in place, since either imports it), there is nothing to keep the hook from, and it is
    returned as it is. A torch.compile first called after the hooks are made (inside the block) would trace them."""
    if "torch._dynamo" not in sys.modules:
        return hook
    eager: _F = torch.compiler.disable(hook)  # type: ignore[no-untyped-call]
    return eager


def hook_model(
    model: torch.nn.Module, recorder: Recorder, level: Level, backward: bool = False, compiled: Sequence[str] = ()
) -> list[torch.utils.hooks.RemovableHandle]:
    """Hooks on the modules recorded (the model itself always); with level "op", on every module, so that each op
    is known to be inside the innermost (and recorded only where that module is). With `backward`, the recorded
    modules' gradients too (`_hook_backward`)."""
    handles = []
    shared = aliases(model, recorder.root_name)  # modules of several names: each call named by its slot
    for name, module in model.named_modules():
        path = recorder.root_name if not name else f"{recorder.root_name}.{name}"
        names = shared.get(id(module), (path,))
        wanted = any(recorder.wanted(p) for p in names)  # a shared module: recorded from the slots `modules=` say
        node = module is model or wanted
        runs_compiled = name in compiled
        if not node and level == "module":
            if shared:  # not recorded, but followed: a shared module's slot is chosen by the innermost call
                handles.extend(_follow(module, names, recorder))
            continue

        def pre(
            called: torch.nn.Module,
            args: tuple[Any, ...],
            kwargs: dict[str, Any],
            path: str = path,
            names: tuple[str, ...] = names,
            node: bool = node,
            wanted: bool = wanted,
            runs_compiled: bool = runs_compiled,
            is_model: bool = module is model,
        ) -> None:
            recorder.halt_if_done()
            if recorder.recomputed_call(is_model):
                recorder.enter_recomputed(path, level)
                return
            recorder.busy = True
            try:
                named = recorder.names.enter(names)
                if len(names) > 1:
                    wanted = recorder.wanted(named)
                    node = recorder.names.entered[-1].recorded = is_model or wanted
                call = recorder.enter(named, called, args, kwargs) if node else named
                if level == "op":
                    inside = runs_compiled or bool(recorder.scopes and recorder.scopes[-1].compiled)
                    recorder.scopes.append(Scope(call, wanted, inside))
                    if runs_compiled:
                        recorder.compiled_calls.setdefault(path, None)
            finally:
                recorder.busy = False

        def post(
            _: torch.nn.Module,
            args: tuple[Any, ...],
            kwargs: dict[str, Any],
            output: Any,
            node: bool = node,
            path: str = path,
            grads: bool = backward and node,
        ) -> None:
            recorder.halt_if_done()
            if recorder.recomputing:
                recorder.leave_recomputed(level)
                return
            if grads and not isinstance(output, torch.Tensor | tuple) and torch.is_grad_enabled():
                # torch's Module call wraps only a tensor or a tuple for the backward hooks (it warns otherwise)
                recorder.unseen_grads.setdefault(path, type(output).__name__)
            recorder.busy = True
            try:
                node = recorder.names.leave(node)
                if level == "op":
                    recorder.scopes.pop()
                if node:
                    recorder.leave(output)
            finally:
                recorder.busy = False

        # inside a compiled region, torch.compile runs the hooks as they are, between its graphs, on real tensors
        handles.append(module.register_forward_pre_hook(_eager(pre), with_kwargs=True))
        handles.append(module.register_forward_hook(_eager(post), with_kwargs=True, always_call=True))
        if backward and node:
            handles.extend(_hook_backward(module, path, recorder))
    return handles


def _follow(
    module: torch.nn.Module, names: tuple[str, ...], recorder: Recorder
) -> list[torch.utils.hooks.RemovableHandle]:
    """Hooks on a module not recorded (`modules=`) of a model with shared modules, which only follow its calls
    (`CallNames.enter`, `leave`), as every module's are followed where the calls are replayed
    (`module_names.slots_followed`): without them a shared module's slot was chosen under the innermost recorded
    call (often the model's), so T5's decoder's embedding, called inside the decoder, was named the encoder's."""
    followed: list[bool] = []  # each call of the module under way, innermost last: whether it was followed

    def pre(_: torch.nn.Module, __: tuple[Any, ...]) -> None:
        recomputed = recorder.recomputing > 0 or recorder.recomputed_call(False)  # as the recorded modules do
        followed.append(not recomputed)
        if not recomputed:
            recorder.names.enter(names)

    def post(_: torch.nn.Module, __: tuple[Any, ...], ___: Any) -> None:
        if followed and followed.pop():
            recorder.names.leave(False)

    return [
        module.register_forward_pre_hook(_eager(pre)),
        module.register_forward_hook(_eager(post), always_call=True),
    ]


def _hook_backward(module: torch.nn.Module, path: str, recorder: Recorder) -> list[torch.utils.hooks.RemovableHandle]:
    """The gradients of a recorded module as the backward pass computes them: of its outputs (before its own
    backward runs), of its inputs (after), and of each of its own parameters once accumulated."""

    @_eager
    def record(name: str, value: Any) -> None:
        recorder.busy = True
        try:
            recorder.record_grad(name, value)
        finally:
            recorder.busy = False

    def grad_output(_: torch.nn.Module, grads: tuple[torch.Tensor | None, ...]) -> None:
        record(f"{path}/grad_output", grads)

    def grad_input(
        _: torch.nn.Module, grads: tuple[torch.Tensor | None, ...], __: tuple[torch.Tensor | None, ...]
    ) -> None:
        record(f"{path}/grad_input", grads)

    handles = [module.register_full_backward_pre_hook(grad_output), module.register_full_backward_hook(grad_input)]
    for name, parameter in module.named_parameters(recurse=False):
        if parameter.requires_grad:

            def accumulated(p: torch.Tensor, name: str = f"{path}.{name}/grad") -> None:
                record(name, p.grad)

            handles.append(parameter.register_post_accumulate_grad_hook(accumulated))  # type: ignore[no-untyped-call]
    return handles


@contextmanager
def quiet_backward_hook_warnings() -> Iterator[None]:
    """torch's UserWarnings about the full backward hooks `capture(backward=True)` adds, silenced while it records:
    they are about the capture's hooks, not the user's code; what they mean for the run is said in its notes
    (`run_notes`), or is nothing to record (no input of the first module requires a gradient)."""
    with warnings.catch_warnings():
        for words in _BACKWARD_HOOK_WARNINGS:
            warnings.filterwarnings("ignore", message=words, category=UserWarning)
        yield


_BACKWARD_HOOK_WARNINGS = (
    "For backward hooks to be called, module output should be a Tensor or a tuple of Tensors",
    "Full backward hook is firing when gradients are computed with respect to module outputs since no inputs",
)
