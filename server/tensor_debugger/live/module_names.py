"""The name a call of a module is recorded under, where one module object is registered under several names.

A module placed in several slots (`nn.ModuleList([block] * n)`, weights shared across layers; an embedding that is
both `shared` and `encoder.embed_tokens`) is one object that `named_modules()` lists once, under its first name. Its
calls were all named by that name (`layers.0`, `layers.0#2`), so against a model with one module per slot (the
same block copied, untied) no call after the first paired with anything. Each call is now named by the slot it is
called from, where that can be told: among the module's names, those inside the innermost module being called (the
decoder's `embed_tokens`, not the encoder's); where several are (the slots of one list), in turn, in the order
`named_modules` lists them: its first call inside that module call takes the first, the next the second. A module
registered once keeps its name, whatever the number of its calls (ALBERT's layer group called 12 times:
`layer#2` ...)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch


def aliases(model: torch.nn.Module, root_name: str) -> dict[int, tuple[str, ...]]:
    """Each module object of `model` registered under more than one name: its full paths, in `named_modules`'s
    order (the first is the name `named_modules()` gives it)."""
    paths: dict[int, list[str]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        paths.setdefault(id(module), []).append(root_name if not name else f"{root_name}.{name}")
    return {key: tuple(names) for key, names in paths.items() if len(names) > 1}


@dataclass
class _Entered:
    path: str
    turns: dict[str, int] = field(default_factory=dict)  # calls of each shared module made inside this call, by name
    recorded: bool | None = None  # a shared module's call: whether its slot's name is recorded (`modules=`)


@dataclass
class CallNames:
    """The module calls under way (innermost last), each by the name it was recorded under."""

    entered: list[_Entered] = field(default_factory=list)
    outside: dict[str, int] = field(default_factory=dict)  # the turns of calls made inside no module call

    def enter(self, paths: tuple[str, ...]) -> str:
        """The name of the call of the module whose names are `paths` beginning now (the only one where it has one
        name), kept until `leave`."""
        chosen = paths[0]
        if len(paths) > 1:
            outer = self.entered[-1] if self.entered else None
            inside = [p for p in paths if outer is not None and p.startswith(f"{outer.path}.")] or list(paths)
            turns = outer.turns if outer is not None else self.outside
            turn = turns.get(paths[0], 0)
            turns[paths[0]] = turn + 1
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
