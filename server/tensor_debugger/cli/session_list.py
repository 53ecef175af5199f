"""`sessions`' output, for the data dir's sessions and a server's alike: typed (`--json` prints these fields)."""

from __future__ import annotations

import json

import msgspec


class ListedRun(msgspec.Struct, frozen=True):
    id: int
    label: str
    role: str  # reference, candidate or noise
    status: str
    tensors: int


class ListedSession(msgspec.Struct, frozen=True):
    id: int
    name: str
    created_at: str  # ISO 8601, with the zone
    runs: list[ListedRun]


def print_sessions(sessions: list[ListedSession], as_json: bool, where: str = "") -> None:
    """`where`: the data dir or server listed, named where it has none."""
    if as_json:
        print(json.dumps(msgspec.to_builtins(sessions)))
        return
    if not sessions:
        print(f"no sessions yet{f' in {where}' if where else ''}")
    for s in sessions:
        runs = ", ".join(
            f"{r.label} ({r.tensors} tensor{'' if r.tensors == 1 else 's'}"
            f"{'' if r.status == 'ready' else ', ' + r.status})"
            for r in s.runs
        )
        print(f"{s.id:>4}  {s.name}  [{runs}]")
