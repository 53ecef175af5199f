"""How a capture names a module call's tensors (`call_recorder.py`): `Net.attn_inputs_args_0`, `Net.attn_outputs`,
an op's `Net.attn/mul#1_outputs`; read back by `find_divergence` and its answer."""

from __future__ import annotations

# the names' rules the session's report reads too
from tensor_debugger.engine.capture_order import is_module_input, module_of

__all__ = ["call_path", "is_module_input", "module_of"]


def call_path(call: str) -> tuple[str, int]:
    """A module call's path inside its model and which call of it it is (from 1): `Net.layers.1#2` -> ("layers.1",
    2)."""
    path, _, number = call.partition("#")
    return path.partition(".")[2], int(number) if number else 1
