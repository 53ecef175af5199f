"""The name a call of a module is recorded under, where one module object is registered under several names.

A module placed in several slots (`nn.ModuleList([block] * n)`, weights shared across layers; an embedding that is
both `shared` and `encoder.embed_tokens`) is one object that `named_modules()` lists once, under its first name. Its
calls were all named by that name (`layers.0`, `layers.0#2`), so against a model with one module per slot (the
same block copied, untied) no call after the first paired with anything. Each call is now named by the slot it is
called from, where that can be told: among the module's names, those inside the innermost module being called (the
decoder's `embed_tokens`, not the encoder's); where several are, in turn, in the order `named_modules` lists
them: its first call inside that module call takes the first, the next the second. The slots of one list
(`blocks.0`, `blocks.1`) are iterated by a loop, which may call each from several places (`x = block(block(x))`):
their turns are counted apart for each place calling the module (each call instruction of the code), so that loop
names its calls `blocks.0`, `blocks.0#2`, `blocks.1`, `blocks.1#2`, as a port with one copy per slot does. Slots
that are attributes (`self.a = self.b = linear`) are called by name, one place each: their turns are counted over
all places (`self.a(x)`, then `self.b(x)`: `a`, `b`). What these rules cannot tell: a list's slots called one by
one from places of their own (`self.blocks[0](x)`, then `self.blocks[1](x)`) each take the first slot (`blocks.0`,
`blocks.0#2`: unpaired against a port's `blocks.1`, as before slots were named, or, where the port calls
`blocks.0` twice, paired with its second call); attributes called twice each in a row from two places
(`self.a(self.a(x))`, then `self.b(self.b(x))`) take the slots in turn (`a`, `b`, `a#2`, `b#2`: paired wrongly).
A module registered once keeps its name, whatever the number of its calls (ALBERT's layer group called 12 times:
`layer#2` ...).

Every module call must be followed (`enter`, `leave`), recorded or not: the innermost call is what chooses a
slot."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import CodeType, FrameType
from typing import Any

import torch

from tensor_debugger.live.ops import user_code_skips


def aliases(model: torch.nn.Module, root_name: str) -> dict[int, tuple[str, ...]]:
    """Each module object of `model` registered under more than one name: its full paths, in `named_modules`'s
    order (the first is the name `named_modules()` gives it)."""
    paths: dict[int, list[str]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        paths.setdefault(id(module), []).append(root_name if not name else f"{root_name}.{name}")
    return {key: tuple(names) for key, names in paths.items() if len(names) > 1}


Site = tuple[CodeType, int] | None  # the place calling a module (`call_site`)


@dataclass
class _Entered:
    path: str
    # calls of each shared module made inside this call, by its first name and the place calling it (`call_site`)
    turns: dict[tuple[str, Site], int] = field(default_factory=dict)
    recorded: bool | None = None  # a shared module's call: whether its slot's name is recorded (`modules=`)


@dataclass
class CallNames:
    """The module calls under way (innermost last), each by the name it was recorded under."""

    entered: list[_Entered] = field(default_factory=list)
    outside: dict[tuple[str, Site], int] = field(default_factory=dict)  # the turns of calls inside no module call
    skip: tuple[str, ...] = field(default_factory=user_code_skips)  # the folders whose frames call no module

    def enter(self, paths: tuple[str, ...]) -> str:
        """The name of the call of the module whose names are `paths` beginning now (the only one where it has one
        name), kept until `leave`."""
        chosen = paths[0]
        if len(paths) > 1:
            outer = self.entered[-1] if self.entered else None
            inside = [p for p in paths if outer is not None and p.startswith(f"{outer.path}.")] or list(paths)
            turns = outer.turns if outer is not None else self.outside
            listed = all(p.rpartition(".")[2].isdigit() for p in inside)  # a list's slots: a loop's
            key = (paths[0], call_site(sys._getframe(1), self.skip) if listed else None)
            turn = turns.get(key, 0)
            turns[key] = turn + 1
            chosen = inside[turn % len(inside)]
        self.entered.append(_Entered(chosen))
        return chosen

    def leave(self, recorded: bool) -> bool:
        """End the innermost call; whether it is recorded: as its slot's name was (a shared module's), else
        `recorded`, the module's."""
        if not self.entered:
            return recorded
        entered = self.entered.pop()
        return recorded if entered.recorded is None else entered.recorded


def call_site(frame: FrameType | None, skip: tuple[str, ...]) -> Site:
    """The place that called a module, from a frame of its hooks: the code and the instruction of the first frame
    outside `skip` (torch's, this package's), a generated one (torch.fx's code: one place for the model's call) and a
    `__call__` that a module's class defines around torch's (as `ops.module_caller` finds the line); None where there
    is none."""
    while frame is not None:
        code = frame.f_code
        wrapper = code.co_name == "__call__" and isinstance(frame.f_locals.get("self"), torch.nn.Module)
        if not wrapper and not code.co_filename.startswith((*skip, "<frozen ", "<eval_with_key>")):
            return code, frame.f_lasti
        frame = frame.f_back
    return None


@contextmanager
def slots_followed(model: torch.nn.Module) -> Iterator[Callable[[torch.nn.Module], str] | None]:
    """Within the block, a function giving the path (inside `model`, "" for itself) that the call of a module
    beginning now is recorded under, the recorder's way: for hooks of others, which run after these (registered
    first). None, and nothing hooked, where no module of `model` is shared (each call's path is then its module's)."""
    shared = aliases(model, "")  # "" the model, ".layers.0" a module inside it
    if not shared:
        yield None
        return
    names = CallNames()

    def pre(module: torch.nn.Module, _: tuple[Any, ...], paths: tuple[str, ...]) -> None:
        names.enter(shared.get(id(module), paths))

    def post(_: torch.nn.Module, __: tuple[Any, ...], ___: Any) -> None:
        names.leave(True)

    handles = []
    for name, module in model.named_modules():
        paths = (f".{name}" if name else "",)
        handles.append(module.register_forward_pre_hook(functools.partial(_pre_of, pre, paths)))
        handles.append(module.register_forward_hook(post, always_call=True))
    try:
        yield lambda module: names.entered[-1].path[1:] if names.entered else ""
    finally:
        for handle in handles:
            handle.remove()


def _pre_of(
    pre: Callable[[torch.nn.Module, tuple[Any, ...], tuple[str, ...]], None],
    paths: tuple[str, ...],
    module: torch.nn.Module,
    args: tuple[Any, ...],
) -> None:
    pre(module, args, paths)
