"""A session's pairing as a file: its rules (the chain of strategies and the name pattern), its pairs and what
stays unpaired, exported as JSON and imported again (into the same session, another one, or `compare
--pairing`).

    {"strategies": ["layer_stage", "name", "fuzzy:0.8"], "name_pattern": "L(?P<layer>\\d+)_(?P<stage>\\w+)",
     "dims": {"*attn*": "batch,heads,tokens,head_dim"},
     "pairs": [{"a": "reference name", "b": "candidate name"}],
     "unpaired": [{"a": "never paired with", "b": "this one"}, {"a": "never paired at all"}, {"b": "..."}]}

Every key is optional; one left out leaves that part of the session as it is. Imported pairs become manual
pairs (they win over every strategy) and `unpaired` entries the user's refusals (a reference tensor left without
partner by one is allowed: it does not make the session's verdict incomplete); in a session with several
candidate runs an entry may name its candidate run's label as `"run"` (otherwise it applies to every one).
"""

from __future__ import annotations

from typing import Any

import msgspec
from sqlalchemy import delete, select
from sqlalchemy.orm import Session as DbSession

from tensor_debugger.compare.context import tensor_ref
from tensor_debugger.engine.dimension_names import parse_dims
from tensor_debugger.engine.logical_tensors import group_shards
from tensor_debugger.engine.name_patterns import apply_name_pattern, compile_name_pattern
from tensor_debugger.engine.pairing import parse_strategies
from tensor_debugger.errors import ConflictError, InvalidInputError
from tensor_debugger.store import catalog
from tensor_debugger.store.models import PairOverrideRecord, PairRecord, SessionRecord, TensorRecord

KEYS = ("strategies", "name_pattern", "dims", "pairs", "unpaired")


class PairedNames(msgspec.Struct, omit_defaults=True):
    """A pair kept in the file: the reference's tensor `a` and the candidate's `b` (in `run`, where the session has
    several candidate runs)."""

    a: str
    b: str
    run: str | None = None


class UnpairedNames(msgspec.Struct, omit_defaults=True):
    """What stays unpaired: {"a", "b"}, never these two; {"a"} or {"b"}, this tensor (in `run`, where several)."""

    a: str | None = None
    b: str | None = None
    run: str | None = None


class PairingExport(msgspec.Struct):
    """A session's pairing file, as GET answers and PUT takes it."""

    strategies: list[str] | None  # the chain of pairing strategies; null: the default one
    name_pattern: str | None  # a regex with groups layer and stage (and rank); null: none
    dims: dict[str, str] | None  # name glob -> comma-separated dimension names; null: none
    pairs: list[PairedNames]
    unpaired: list[UnpairedNames]


def check_rules(strategies: Any, name_pattern: Any) -> tuple[list[str] | None, str | None]:
    """The chain and the pattern as stored (None: the default chain, no pattern). Raises InvalidInputError."""
    if strategies is not None and not (
        isinstance(strategies, str) or (isinstance(strategies, list) and all(isinstance(s, str) for s in strategies))
    ):
        raise InvalidInputError(f"strategies must be a list of strategy names, got {strategies!r}")
    if name_pattern is not None and not isinstance(name_pattern, str):
        raise InvalidInputError(f"name_pattern must be a string, got {name_pattern!r}")
    try:
        chain = parse_strategies(strategies) if strategies else None
        compile_name_pattern(name_pattern)
    except ValueError as exc:
        raise InvalidInputError(str(exc)) from None
    return chain, name_pattern or None


def check_dims(dims: Any) -> dict[str, str] | None:
    """Dimension names as stored (engine/dimension_names.py; None: none). Raises InvalidInputError."""
    try:
        return parse_dims(dims)
    except ValueError as exc:
        raise InvalidInputError(str(exc)) from None


def set_rules(session: SessionRecord, strategies: Any, name_pattern: Any) -> None:
    session.strategies, session.name_pattern = check_rules(strategies, name_pattern)


def export_pairing(db: DbSession, session_id: int) -> PairingExport:
    session = catalog.get_session(db, session_id)
    labels = {r.id: r.label for r in session.runs}
    several = sum(1 for r in session.runs if r.position > 0) > 1

    def run(run_b_id: int) -> str | None:
        return labels[run_b_id] if several else None

    pairs = db.scalars(
        select(PairRecord).where(PairRecord.session_id == session_id).order_by(PairRecord.position)
    ).all()
    refusals = db.scalars(
        select(PairOverrideRecord).where(
            PairOverrideRecord.session_id == session_id, PairOverrideRecord.action == "unpair"
        )
    ).all()
    # only the user's refusals: a tensor that merely found no partner is not listed, or importing the file again
    # would allow it to stay unpaired (and the session's verdict would no longer count it as not compared)
    unpaired = [UnpairedNames(o.a_name or None, o.b_name or None, run(o.run_b_id)) for o in refusals]
    return PairingExport(
        session.strategies,
        session.name_pattern,
        session.dims,
        [PairedNames(p.a_name, p.b_name, run(p.run_b_id)) for p in pairs],
        unpaired,
    )


def _check_names(
    db: DbSession,
    session: SessionRecord,
    pattern: str | None,
    pairs: list[dict[str, str]],
    unpaired: list[dict[str, str]],
) -> None:
    """Refuse entries naming a tensor no run has: a pair whose name is a typo would otherwise leave its tensor to
    the automatic strategies, unsaid, the pairing the user asked for not made. Names are the ready runs' tensors as
    pairing sees them (shards merged, under the name pattern). While a run is still ingesting its tensors are not
    all known: a file naming tensors is refused then (ConflictError: send it again once the runs are ready), never
    taken unchecked; so is one naming a side (reference, candidate) with no ready run to check against."""
    if not pairs and not unpaired:
        return
    runs = list(session.runs)
    ingesting = [r.label for r in runs if r.status not in ("ready", "failed")]
    if ingesting:
        named = ("run " if len(ingesting) == 1 else "runs ") + ", ".join(repr(label) for label in ingesting)
        raise ConflictError(
            f"session {session.id} is still ingesting {named}: a pairing file's names are checked against the runs' "
            "tensors, which are not all known yet; send it again once every run is ready (the session page shows "
            "the progress); nothing was changed"
        )
    runs = [r for r in runs if r.status == "ready"]
    compiled = compile_name_pattern(pattern)

    def names(run_id: int) -> set[str]:  # one run's: shards of two runs are no set of one tensor's
        rows = db.scalars(select(TensorRecord).where(TensorRecord.run_id == run_id))
        refs = apply_name_pattern([tensor_ref(t) for t in rows], compiled)
        return {t.name for t in group_shards(refs, compiled)}

    each = {r.id: names(r.id) for r in runs}
    known = {"a": set().union(*each.values()), "b": set().union(*(each[r.id] for r in runs if r.position > 0))}
    ready = {"a": bool(runs), "b": any(r.position > 0 for r in runs)}
    for key, items in (("pairs", pairs), ("unpaired", unpaired)):
        for n, item in enumerate(items):
            for side, who in (("a", "reference"), ("b", "candidate")):
                name = item.get(side)
                if name is not None and not ready[side]:
                    raise ConflictError(
                        f"{key}[{n}] names a {who} tensor, {name!r}, and session {session.id} has no ready {who} run "
                        "to check it against; nothing was changed"
                    )
                if name is not None and name not in known[side]:
                    raise InvalidInputError(f"{key}[{n}]: the {who} has no tensor named {name!r}")


def _entries(data: dict[str, Any], key: str) -> list[dict[str, str]]:  # a file's JSON, checked here
    items = data[key]
    if not isinstance(items, list):
        raise InvalidInputError(f"{key} must be a list of objects, got {type(items).__name__}")
    for n, item in enumerate(items):
        wanted = ("a", "b") if key == "pairs" else ()
        if (
            not isinstance(item, dict)
            or set(item) - {"a", "b", "run"}
            or not all(isinstance(v, str) and v for v in item.values())
            or any(k not in item for k in wanted)
            or not (set(item) & {"a", "b"})
        ):
            need = '"a" and "b"' if key == "pairs" else '"a", "b" or both'
            raise InvalidInputError(
                f'{key}[{n}] must be an object with {need} (names) and optionally "run" '
                f"(a candidate run's label), got {item!r}"
            )
    return items


def check_file(data: Any) -> dict[str, Any]:  # a file's JSON as read, returned once checked
    """The pairing file `data` if it is one (keys, rules and entries well formed); raises InvalidInputError."""
    if not isinstance(data, dict):
        raise InvalidInputError("a pairing file is a JSON object")
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise InvalidInputError(f"a pairing file has no key {unknown[0]!r}: the keys are {', '.join(KEYS)}")
    check_rules(data.get("strategies"), data.get("name_pattern"))
    check_dims(data.get("dims"))
    for key in ("pairs", "unpaired"):
        if key in data:
            _entries(data, key)
    return data


def import_pairing(db: DbSession, session_id: int, data: Any) -> None:
    """Apply a pairing file to the session (the caller plans again). Raises InvalidInputError, changing nothing,
    on anything it does not understand."""
    check_file(data)
    session = catalog.get_session(db, session_id)
    strategies, pattern = check_rules(
        data.get("strategies", session.strategies), data.get("name_pattern", session.name_pattern)
    )
    pairs = _entries(data, "pairs") if "pairs" in data else None
    unpaired = _entries(data, "unpaired") if "unpaired" in data else None
    candidates = {r.label: r.id for r in session.runs if r.position > 0}
    for item in (*(pairs or ()), *(unpaired or ())):
        if "run" in item and item["run"] not in candidates:
            raise InvalidInputError(f"the session has no candidate run labelled {item['run']!r}")
    _check_names(db, session, pattern, pairs or [], unpaired or [])
    session.strategies, session.name_pattern = strategies, pattern
    if "dims" in data:
        session.dims = check_dims(data["dims"])
    for action, items in (("pair", pairs), ("unpair", unpaired)):
        if items is None:
            continue
        db.execute(
            delete(PairOverrideRecord).where(
                PairOverrideRecord.session_id == session_id, PairOverrideRecord.action == action
            )
        )
        for item in items:
            for label, run_id in candidates.items():
                if item.get("run", label) == label:
                    db.add(
                        PairOverrideRecord(
                            session_id=session_id,
                            run_b_id=run_id,
                            action=action,
                            a_name=item.get("a", ""),
                            b_name=item.get("b", ""),
                        )
                    )
