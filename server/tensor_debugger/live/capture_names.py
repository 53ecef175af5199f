"""How a capture names a module call's tensors (`call_recorder.py`): `Net.attn_inputs_args_0`, `Net.attn_outputs`,
an op's `Net.attn/mul#1_outputs`; read back by `find_divergence` and its answer."""

from __future__ import annotations

import re

_PLACE = re.compile(r"_(?:inputs_(?:args|kwargs)_.+|outputs(?:_.+)?)$")


def module_of(name: str) -> str:
    """The module call of a tensor's name: `Net.layers.1.self_attn/mul#1_outputs` -> `Net.layers.1.self_attn`."""
    return _PLACE.sub("", name).partition("/")[0]


def is_module_input(name: str) -> bool:
    """Whether a tensor's name is a module's input's (`Net.attn.o_inputs_args_0`), not an op's or an output's."""
    return "/" not in name and "_inputs_" in name[len(module_of(name)) :]


def call_path(call: str) -> tuple[str, int]:
    """A module call's path inside its model and which call of it it is (from 1): `Net.layers.1#2` -> ("layers.1",
    2)."""
    path, _, number = call.partition("#")
    return path.partition(".")[2], int(number) if number else 1
