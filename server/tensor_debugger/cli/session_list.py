"""`sessions`' output, for the data dir's sessions and a server's alike."""

from __future__ import annotations

import json
from typing import Any


def print_sessions(data: list[dict[str, Any]], as_json: bool, where: str = "") -> None:
    """`where`: the data dir or server listed, named where it has none."""
    if as_json:
        print(json.dumps(data))
        return
    if not data:
        print(f"no sessions yet{f' in {where}' if where else ''}")
    for s in data:
        runs = ", ".join(
            f"{r['label']} ({r['tensors']} tensor{'' if r['tensors'] == 1 else 's'}"
            f"{'' if r['status'] == 'ready' else ', ' + r['status']})"
            for r in s["runs"]
        )
        print(f"{s['id']:>4}  {s['name']}  [{runs}]")
