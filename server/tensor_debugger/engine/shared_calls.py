"""One module called N times under one name (ALBERT's layer group: `encoder.albert_layer_groups.0`, its calls
`...#2`, `...#3`) against one copy per call (a port's `encoder.layers.0` .. `layers.N-1`): no name pairs them, so
nothing inside that stack was compared. They pair by a rule, said as one: the k-th call of the shared module with
the k-th copy. It holds only where the copies are called in order, each once, so it is applied only where the
names show that:

- the reference's module `P.M` is called N >= 2 times and the candidate records nothing under that path; the
  candidate's `P.L.0` .. `P.L.(N-1)` (one list under the same parent `P`, N entries, the reference recording nothing
  under `P.L`) are each called once, in their order (each copy's first tensor after the one before's);
- each copy holds the same submodules as the shared module (their paths below it), and each submodule is called as
  often in every copy, N times that in the shared module;
- one such list for one such module: where several could, none is paired.

The candidate's names are then read as the reference names that call (`P.L.2.ffn/linear#1_outputs` as
`P.M.ffn#3/linear#1_outputs`: a submodule called c times per copy takes, in copy j, the calls j*c+1 .. j*c+c)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from tensor_debugger.engine.capture_order import module_of

_CALL = re.compile(r"^(.*?)(?:#(\d+))?$")


@dataclass(frozen=True)
class SharedCalls:
    """The rule applied once: the reference's module `shared` (its path without the model's class name), called
    `calls` times, paired call by call with the candidate's copies `copies.0` .. `copies.(calls-1)`."""

    shared: str
    copies: str
    calls: int

    def words(self) -> str:
        return (
            f"paired by a rule, not by name: the k-th call of the reference's {self.shared} (one module, called "
            f"{self.calls} times) with the candidate's k-th copy, {self.copies}.0 .. {self.copies}.{self.calls - 1} "
            "(each called once, in that order: the rule holds only there)"
        )


def _split(key: str) -> tuple[str, int, str]:
    """(module path, call index, the rest) of a name without the model's class name: `.enc.ffn#3/mul#1_outputs`
    -> (".enc.ffn", 3, "/mul#1_outputs")."""
    call = module_of(key)
    found = _CALL.match(call)
    assert found is not None
    return found[1], int(found[2] or 1), key[len(call) :]


def _calls(keys: Sequence[str]) -> tuple[dict[str, int], dict[str, int]]:
    """Each module path's calls (the highest call index) and the first position any tensor of it was recorded."""
    calls: dict[str, int] = {}
    first: dict[str, int] = {}
    for at, key in enumerate(keys):
        path, index, _ = _split(key)
        calls[path] = max(calls.get(path, 0), index)
        first.setdefault(path, at)
    return calls, first


def _below(calls: dict[str, int], path: str) -> dict[str, int]:
    """The submodules' calls below `path`, by their path relative to it ("" for its own)."""
    return {p[len(path) :]: n for p, n in calls.items() if p == path or p.startswith(path + ".")}


def shared_calls(reference: Sequence[str], candidate: Sequence[str]) -> tuple[dict[str, str], list[SharedCalls]]:
    """The candidate's names (`candidate`, without the model's class name, in its order) to read as the reference's
    (`reference`, likewise), each with the name of the reference's call of the shared module it pairs with, and the
    rules applied; nothing where the names do not show the rule holds (the module docstring)."""
    calls_a, _ = _calls(reference)
    calls_b, first_b = _calls(candidate)
    options: list[tuple[str, str, int]] = []
    for shared, count in calls_a.items():
        if count < 2 or shared in calls_b or "." not in shared:
            continue
        parent = shared.rpartition(".")[0]
        if re.fullmatch(r"\d+", shared.rpartition(".")[2]):  # a list's entry (`groups.0`): its list's parent
            parent = parent.rpartition(".")[0]
        inner = _below(calls_a, shared)
        lists = {
            found[1]
            for p in calls_b
            if (found := re.fullmatch(re.escape(parent) + r"\.([^.]+)\.(\d+)", p)) and not p.startswith(shared)
        }
        for name in lists:
            copies = f"{parent}.{name}"
            if copies in calls_a or any(p.startswith(copies + ".") for p in calls_a):
                continue
            paths = [f"{copies}.{j}" for j in range(count)]
            if f"{copies}.{count}" in calls_b or any(p not in calls_b or calls_b[p] != 1 for p in paths):
                continue
            if any(first_b[paths[j]] >= first_b[paths[j + 1]] for j in range(count - 1)):
                continue  # not called in order
            each = [_below(calls_b, p) for p in paths]
            if any(e.keys() != inner.keys() or e != each[0] for e in each):
                continue
            if any(each[0][sub] * count != inner[sub] for sub in inner):
                continue
            options.append((shared, copies, count))
    # one list for one module: a list two modules could claim, or a module two lists could, pairs nothing
    lists_of = [o[1] for o in options]
    modules_of = [o[0] for o in options]
    chosen = [o for o in options if lists_of.count(o[1]) == 1 and modules_of.count(o[0]) == 1]
    renamed: dict[str, str] = {}
    for shared, copies, _ in chosen:
        per = _below(calls_b, f"{copies}.0")
        for key in candidate:
            path, index, rest = _split(key)
            found = re.match(re.escape(copies) + r"\.(\d+)((?:\..*)?)$", path)
            if found is None:
                continue
            sub, j = found[2], int(found[1])
            number = j * per[sub] + index
            renamed[key] = f"{shared}{sub}{f'#{number}' if number > 1 else ''}{rest}"
    return renamed, [SharedCalls(s.lstrip("."), c.lstrip("."), n) for s, c, n in chosen]
