"""Which parameter of a module's `forward` each argument of a call binds to, as Python binds it: the `i`-th
positional argument to the `i`-th positional parameter (up to a `*args` or the first keyword-only one), a keyword
argument to the parameter of its name. The capture records it on each module input (`recorder.py`), so that an
input passed by keyword on one side and by position on the other pairs (`engine/pairing.parameter_key`)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ForwardParameters:
    positional: tuple[str, ...]  # positional-only and positional-or-keyword, in order, up to `*args`/keyword-only
    keywords: frozenset[str]  # those a keyword binds to: positional-or-keyword and keyword-only

    def of_argument(self, index: int) -> str | None:
        """The parameter the positional argument `index` binds to; None past the named ones (into `*args`)."""
        return self.positional[index] if index < len(self.positional) else None

    def of_keyword(self, key: str) -> str | None:
        """The parameter the keyword argument `key` binds to; None where none is named so (into `**kwargs`)."""
        return key if key in self.keywords else None


def forward_parameters(module: torch.nn.Module) -> ForwardParameters | None:
    """The parameters of `module.forward` (through wrappers that keep `__wrapped__`); None where it has no
    signature Python can read (a builtin, a C extension's)."""
    try:
        signature = inspect.signature(module.forward)
    except (TypeError, ValueError):
        return None
    positional: list[str] = []
    keywords: set[str] = set()
    open_positional = True
    for parameter in signature.parameters.values():
        if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD) and open_positional:
            positional.append(parameter.name)
        else:
            open_positional = False
        if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
            keywords.add(parameter.name)
    return ForwardParameters(tuple(positional), frozenset(keywords))
