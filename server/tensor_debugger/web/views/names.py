"""Long tensor and module names shortened in the middle, never at the end: the page splits a name into a head
that gives way (an ellipsis where it is cut) and a tail that always shows whole, so `...self_attn.o_proj` and
`...self_attn.k_proj` stay told apart at any width (web/templates/_name.html)."""

from __future__ import annotations

TAIL_PARTS = 2  # dotted parts kept whole at the end: the block and the module (`self_attn.o_proj`)
TAIL_MOST = 28  # characters: a longer tail keeps only its last part


def name_parts(name: str) -> tuple[str, str]:
    """(head, tail) with head + tail == name: the tail is the name's last two dotted parts (its last one where
    those two are long), the head the rest with its dot."""
    parts = name.split(".")
    if len(parts) <= 1:
        return "", name
    tail = ".".join(parts[-TAIL_PARTS:])
    if len(tail) > TAIL_MOST:
        tail = parts[-1]
    head = name[: len(name) - len(tail)]
    return head, tail
