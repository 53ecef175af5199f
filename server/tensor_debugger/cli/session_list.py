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
    compared_against: int | None = None  # the id of the run it is compared against; None: the session's reference


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
        labels = {r.id: r.label for r in s.runs}
        runs = ", ".join(
            f"{r.label} ({r.tensors} tensor{'' if r.tensors == 1 else 's'}"
            f"{'' if r.status == 'ready' else ', ' + r.status}{_against(r, labels)})"
            for r in s.runs
        )
        print(f"{s.id:>4}  {s.name}  [{runs}]")


def _against(run: ListedRun, labels: dict[int, str]) -> str:
    """ ", against LABEL" for a run compared against another run than the session's reference; else ""."""
    if run.compared_against is None:
        return ""
    return f", against {labels.get(run.compared_against, f'run {run.compared_against}')}"
