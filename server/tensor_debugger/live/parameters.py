"""Which parameter of a module's `forward` each argument of a call binds to, as Python binds it: the `i`-th
positional argument to the `i`-th positional parameter (up to a `*args` or the first keyword-only one), a keyword
argument to the parameter of its name. A positional parameter is recorded with its position beside its name
(`mask@1`, `engine/pairing.py`'s `POSITION_MARK`), so that a keyword argument bound to it pairs with the other
side's argument at that position where their names differ (a port's `forward(self, *args)`). An argument past the
named ones goes into `*args`, recorded as `*{i}` (its position in the call); a keyword no parameter is named for
goes into `**kwargs`, recorded as `**{key}`: neither can be a parameter's name, so neither collides with one
(`ARGS_MARK`, `KWARGS_MARK`). The capture records it on each module input (`call_recorder.py`), so that an input passed
by keyword on one side and by position on the other pairs, and one passed through `**kwargs` pairs with the
parameter of its name (`engine/pairing.parameter_key`, `position_key`)."""

from __future__ import annotations

import inspect
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from tensor_debugger.engine.pairing import ARGS_MARK, KWARGS_MARK, POSITION_MARK


@dataclass(frozen=True)
class ForwardParameters:
    positional: tuple[str, ...]  # positional-only and positional-or-keyword, in order, up to `*args`/keyword-only
    keywords: frozenset[str]  # those a keyword binds to: positional-or-keyword and keyword-only
    var_positional: bool = False  # a `*args`
    var_keyword: bool = False  # a `**kwargs`

    def of_argument(self, index: int) -> str | None:
        """The parameter the positional argument `index` binds to, `{name}@{index}`; `*{index}` past the named ones
        where the forward has a `*args`; None where it has none (Python refuses that call)."""
        if index < len(self.positional):
            return f"{self.positional[index]}{POSITION_MARK}{index}"
        return f"{ARGS_MARK}{index}" if self.var_positional else None

    def of_keyword(self, key: str) -> str | None:
        """The parameter the keyword argument `key` binds to (`{key}@{k}` where it is the positional one k, `key`
        where keyword-only); `**{key}` where none is named so and the forward has a `**kwargs` (a positional-only
        parameter's name too: Python puts that keyword in `**kwargs`); None where it has none."""
        if key in self.keywords:
            return f"{key}{POSITION_MARK}{self.positional.index(key)}" if key in self.positional else key
        return f"{KWARGS_MARK}{key}" if self.var_keyword else None


# `forward_parameters` of a module's forward, by the function its bound `forward` calls: a bound method's signature is
# its function's without the first parameter, whatever the instance. Read once a process (`inspect.signature` took
# about 90 microseconds a module, 14 ms of CPU for the 151 module calls of each GPT-2 capture: bench/RESULTS.md).
_BY_FUNCTION: weakref.WeakKeyDictionary[Any, ForwardParameters | None] = weakref.WeakKeyDictionary()


def forward_parameters(module: torch.nn.Module) -> ForwardParameters | None:
    """The parameters of `module.forward` (through wrappers that keep `__wrapped__`); None where it has no
    signature Python can read (a builtin, a C extension's)."""
    forward = module.forward
    function = getattr(forward, "__func__", None) if getattr(forward, "__self__", None) is module else None
    if function is None:  # a forward set on the instance (a partial, a lambda): read each time
        return _parameters_of(forward)
    try:
        return _BY_FUNCTION[function]
    except KeyError:
        pass
    except TypeError:  # a function no weak reference can be made to
        return _parameters_of(forward)
    found = _BY_FUNCTION[function] = _parameters_of(forward)
    return found


def _parameters_of(forward: Any) -> ForwardParameters | None:
    try:
        signature = inspect.signature(forward)
    except (TypeError, ValueError):
        return None
    positional: list[str] = []
    keywords: set[str] = set()
    open_positional = True
    kinds = {p.kind for p in signature.parameters.values()}
    for parameter in signature.parameters.values():
        if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD) and open_positional:
            positional.append(parameter.name)
        else:
            open_positional = False
        if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
            keywords.add(parameter.name)
    return ForwardParameters(
        tuple(positional),
        frozenset(keywords),
        inspect.Parameter.VAR_POSITIONAL in kinds,
        inspect.Parameter.VAR_KEYWORD in kinds,
    )
