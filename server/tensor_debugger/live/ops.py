"""Op-level capture: every torch function a forward pass calls, seen through `torch.overrides.TorchFunctionMode`.

Each call that returns tensors (matmul, softmax, the arithmetic operators, `F.*`, views and casts) is handed to the
recorder with its op name and the file and line of the user's code that called it: the innermost frame outside torch
(and outside this package), e.g. `.../modeling_llama.py:412`. Calls nested inside another op (the `Tensor.softmax` that
`F.softmax` calls) are not seen: the mode is off while its handler runs. Property getters (`x.shape`, `x.grad`) are left
out: they name an attribute, not an op the code performs; but for those that compute a tensor from the values
(`GETTERS`): `real` and `imag`, which pick one half of a complex tensor's values (FNet's `fftn(x).real`: the port's
`.imag` for it changes nothing else), and the transposes `T`, `mT`, `H` and `mH` (a port transposing a square weight the
reference uses as it is), recorded as ops of those names, each with its line. Left out are the outputs of calls that
allocate without setting values (`torch.empty`, `empty_like`, `new_empty`, ...: `UNINITIALISED`): their bytes are
whatever the memory held, which differ from call to call and from one run to another, so a summary of them would report
a divergence, or a model changing between calls, that is not the model's. Nor are the calls torch's module hooks make
(`BackwardHook`, the identity function it wraps a module's inputs and outputs in where full backward hooks are
registered, as `capture(backward=True)` does): they are the capture's, not the model's, and they come and go with grad
mode (a module checkpointed with use_reentrant=True runs its forward without grad and makes none).
"""

from __future__ import annotations

import functools
import inspect
import linecache
import os
import re
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any, Protocol

import torch
from torch.overrides import TorchFunctionMode

_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tensor_debugger/


class OpSink(Protocol):
    """What the mode hands each op to (the recorder)."""

    busy: bool  # True while the recorder's own hooks run: their torch calls are not the model's

    def recording(self) -> bool:
        """Whether an op called now would be recorded (else its caller is not looked up)."""
        ...

    def record_op(self, op: str, source: str | None, output: Any) -> None: ...


# Calls whose outputs hold no values yet, only memory (see the module docstring): not recorded.
UNINITIALISED = frozenset(
    ("empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided", "empty_quantized")
)


# Property getters recorded as ops (see the module docstring), by the attribute's name.
GETTERS = frozenset(("real", "imag", "T", "mT", "H", "mH"))


def getter_name(func: Callable[..., Any]) -> str | None:
    """The attribute a property getter (`Tensor.real.__get__`) reads; None for any other call."""
    if getattr(func, "__name__", "") != "__get__":
        return None
    return getattr(getattr(func, "__self__", None), "__name__", None)


def op_name(func: Callable[..., Any]) -> str:
    """`softmax`, `matmul`, `add_`; a dunder loses its underscores (`__getitem__` -> `getitem`); a property
    getter is named by its attribute (`real`)."""
    attribute = getter_name(func)
    if attribute is not None:
        return attribute
    name = getattr(func, "__name__", None) or type(func).__name__
    return name.strip("_") if name.startswith("__") and name.endswith("__") else name


def caller_source(frame: FrameType | None, skip: tuple[str, ...]) -> str | None:
    """`path:line` of the innermost frame from `frame` outwards whose file is in none of the folders `skip`, nor
    Python's frozen modules or torch.fx's generated code. Code compiled from a string (`exec`, `python -c`, a script
    read from stdin, an IPython prompt) is the user's too: `<string>:12`, its line in that string, not the line of
    the `exec` that ran it."""
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith("<eval_with_key>"):
            traced = _traced_source(frame, skip)
            if traced is not None:
                return traced
        elif not filename.startswith(skip) and not filename.startswith("<frozen "):
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    return None


_TRACE_LINE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')
_ASSIGNED = re.compile(r"^\s*(?P<name>\w+)\s*=")


def _traced_source(frame: FrameType, skip: tuple[str, ...]) -> str | None:
    """`path:line` of the user's code that a torch.fx graph's generated code (a `torch.compile`d function run by an
    eager backend) runs at `frame`: the innermost frame outside `skip` of the stack trace torch recorded on the graph
    node its line assigns, as it traced the user's code. The frame outside the graph is dynamo's, at the compiled
    function's `def` line, not the line of the op. None where any of it is missing."""
    graph_module = frame.f_locals.get("self")
    graph = getattr(graph_module, "graph", None)
    assigned = _ASSIGNED.match(linecache.getline(frame.f_code.co_filename, frame.f_lineno))
    if graph is None or assigned is None:
        return None
    node = next((n for n in graph.nodes if n.name == assigned["name"]), None)
    trace = node.meta.get("stack_trace") if node is not None else None
    if not isinstance(trace, str):
        return None
    for found in reversed(list(_TRACE_LINE.finditer(trace))):
        if not found["file"].startswith(skip) and not found["file"].startswith("<frozen "):
            return f"{found['file']}:{found['line']}"
    return None


@functools.cache
def user_code_skips() -> tuple[str, ...]:
    """The folders whose frames are not the user's code: torch's and this package's."""
    torch_dir = os.path.dirname(os.path.abspath(inspect.getfile(torch)))
    return (torch_dir + os.sep, _OWN_DIR + os.sep)


def module_caller(frame: FrameType | None, skip: tuple[str, ...]) -> str | None:
    """`path:line` of the code that called a module, from a frame of its hooks (`caller_source`): the line that
    passed the module its inputs (`hidden = self.mlp(hidden)`). A `__call__` that a module's class defines around
    torch's (transformers' `GradientCheckpointingLayer`) passes the call on, and is not that line."""
    while frame is not None:
        filename = frame.f_code.co_filename
        wrapper = frame.f_code.co_name == "__call__" and isinstance(frame.f_locals.get("self"), torch.nn.Module)
        if not wrapper and not filename.startswith(skip) and not filename.startswith(("<frozen ", "<eval_with_key>")):
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    return None


class OpMode(TorchFunctionMode):
    """Hands every tensor-returning torch call of the forward to `sink`, in execution order."""

    def __init__(self, sink: OpSink) -> None:
        super().__init__()
        self.sink = sink
        self.skip = user_code_skips()
        self.hooks_file = os.path.join(self.skip[0], "utils", "hooks.py")  # BackwardHook
        self.function_file = os.path.join(self.skip[0], "autograd", "function.py")  # Function.apply
        # tensors made by an UNINITIALISED call and not written since, by id (`_views_unset_memory`)
        self._fresh: dict[int, weakref.ref[torch.Tensor]] = {}

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        output = func(*args, **(kwargs or {}))
        # the recorder's own calls first (its hooks reading `.dtype`, `._version`, `untyped_storage()` of what they
        # summarise: 1,977 of a GPT-2 summary capture's 2,732 calls here): not the model's, nothing else to ask
        if self.sink.busy or torch.compiler.is_compiling():  # or torch.compile tracing the model: not run here
            return output
        name = getattr(func, "__name__", "")
        if name in UNINITIALISED:
            if isinstance(output, torch.Tensor):
                self._allocated(output)
            return output
        if (name == "__get__" and getter_name(func) not in GETTERS) or not self.sink.recording():
            return output
        if self._fresh and self._views_unset_memory(name, args, kwargs or {}, output):
            return output
        frame = inspect.currentframe()
        if self._from_module_hooks(frame):
            return output
        self.sink.record_op(op_name(func), caller_source(frame, self.skip), output)
        return output

    def _allocated(self, tensor: torch.Tensor) -> None:
        """Keeps `tensor`, made by an `UNINITIALISED` call, as memory not yet written (until it is, or is freed)."""
        key = id(tensor)
        self._fresh[key] = weakref.ref(tensor, lambda _: self._fresh.pop(key, None))

    def _views_unset_memory(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> bool:
        """Whether the call takes a view of a tensor `_allocated` before anything was written into it: DeepSeek-V3's
        `key_states = kv.new_empty(...)`, then `key_states[..., :d].copy_(k_nope)`: the slice, summarised as it is
        made, holds whatever the memory held (it is filled only after), so it is not recorded; what is copied into it
        is (the `copy_`'s output). A write into such a tensor itself (an in-place op on it, `out=` it, an item set)
        makes it an ordinary tensor from then on; any other op reading it before (`t + 1`) is recorded: the model's
        own reading of memory it never set."""
        fresh = [
            a
            for a in (*args, kwargs.get("out"))
            if isinstance(a, torch.Tensor) and (held := self._fresh.get(id(a))) is not None and held() is a
        ]
        if not fresh:
            return False
        writes = name == "__setitem__" or (name.endswith("_") and not name.startswith("__")) or name.startswith("__i")
        if writes or any(kwargs.get("out") is a for a in fresh):
            for a in fresh:
                self._fresh.pop(id(a), None)
            return False
        if not isinstance(output, torch.Tensor) or output.device.type == "meta":
            return False
        storage = output.untyped_storage().data_ptr()
        return any(a.untyped_storage().data_ptr() == storage for a in fresh)

    def _from_module_hooks(self, frame: FrameType | None) -> bool:
        """Whether the call being handled was made by torch's module hooks (`BackwardHook`), through
        `Function.apply`: see the module docstring."""
        caller = frame.f_back if frame is not None else None
        while caller is not None and caller.f_code.co_filename == self.function_file:
            caller = caller.f_back
        return caller is not None and caller.f_code.co_filename == self.hooks_file
