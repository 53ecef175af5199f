"""The ops a module call ran on each side, side by side and aligned as the session paired them (planning's
`engine/op_alignment.pair_ops`): what the pair page of a captured module (or of one of its ops) shows of two
implementations that differ inside it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session as DbSession

from tensor_debugger.engine.op_alignment import align_ops
from tensor_debugger.store.models import PairRecord, TensorRecord

MAX_OPS = 2000  # per side: a module with more shows none (the whole model's list belongs to no one page)


@dataclass(frozen=True)
class OpEntry:
    tensor_id: int
    name: str  # relative to the module: "softmax#1", "q_proj/linear#1"
    op: str  # "softmax"
    shape: list[int]
    source: str | None


@dataclass(frozen=True)
class OpRow:
    a: OpEntry | None  # None: the candidate alone calls this op here
    b: OpEntry | None  # None: the reference alone does
    pair_id: int | None  # the pair of these two ops, where they are one
    status: str | None


@dataclass(frozen=True)
class OpLists:
    module_a: str
    module_b: str
    rows: list[OpRow]
    current: int | None  # the row of the pair shown, where it is an op's


def op_module(module_path: str) -> str:
    """The module call of an op's path (`….self_attn/softmax#1` -> `….self_attn`); a module's path itself."""
    return module_path.partition("/")[0]


def op_lists(db: DbSession, pair: PairRecord, a: Sequence[TensorRecord], b: Sequence[TensorRecord]) -> OpLists | None:
    """The ops inside the module call of `pair` (a module's tensors, or an op's: its module's) on both sides, with
    those of its children, in execution order, aligned; None where neither side recorded ops there."""
    if not a or not b or a[0].module_path is None or b[0].module_path is None:
        return None
    module_a, module_b = op_module(a[0].module_path), op_module(b[0].module_path)
    ops_a = _ops(db, pair.run_a_id, module_a)
    ops_b = _ops(db, pair.run_b_id, module_b)
    if not ops_a and not ops_b:
        return None
    paired = _op_pairs(db, pair, module_a)
    # the rows follow the session's pairs (planned by engine/op_alignment.pair_ops, module call by module call): two
    # ops face each other where they are one pair, each other op is its side's alone, in place
    pair_of_a = {a: found[0] for (a, _), found in paired.items()}
    pair_of_b = {b: found[0] for (_, b), found in paired.items()}
    keys_a = [("pair", pair_of_a[o.tensor_id]) if o.tensor_id in pair_of_a else ("a", k) for k, o in enumerate(ops_a)]
    keys_b = [("pair", pair_of_b[o.tensor_id]) if o.tensor_id in pair_of_b else ("b", k) for k, o in enumerate(ops_b)]
    rows: list[OpRow] = []
    current = None
    for i, j in align_ops(keys_a, keys_b):
        left = ops_a[i] if i is not None else None
        right = ops_b[j] if j is not None else None
        found = paired.get((left.tensor_id, right.tensor_id)) if left and right else None
        if left is not None and left.tensor_id in pair.a_tensor_ids:
            current = len(rows)
        rows.append(OpRow(left, right, found[0] if found else None, found[1] if found else None))
    return OpLists(module_a, module_b, rows, current)


def _ops(db: DbSession, run_id: int, module: str) -> list[OpEntry]:
    """The ops of the module call `module` and of its children's calls: between the call's own first and last
    tensors where it has any (a module called again names its children's calls `child#2`, not after itself)."""
    t = TensorRecord
    first, last = db.execute(
        select(func.min(t.position), func.max(t.position)).where(t.run_id == run_id, t.module_path == module)
    ).one()
    query = select(t.id, t.module_path, t.shape, t.source).where(  # ops: a source, "/" (a module's input: no "/")
        t.run_id == run_id,
        t.source.is_not(None),
        t.module_path.startswith(module, autoescape=True),
        t.module_path.contains("/", autoescape=True),
    )
    if first is not None:
        query = query.where(t.position > first, t.position < last)
    query = query.order_by(t.position).limit(MAX_OPS + 1)
    rows = [r for r in db.execute(query) if r[1].startswith((module + "/", module + "."))]
    if len(rows) > MAX_OPS:
        return []
    entries = []
    for tensor_id, path, shape, source in rows:
        name = path[len(module) :].lstrip(".").lstrip("/")
        entries.append(OpEntry(tensor_id, name, path.rpartition("/")[2].partition("#")[0], list(shape), source))
    return entries


def _op_pairs(db: DbSession, pair: PairRecord, module_a: str) -> dict[tuple[int, int], tuple[int, str]]:
    """The session's pairs of ops inside the module: (reference tensor, candidate tensor) -> (pair id, status)."""
    p = PairRecord
    query = select(p.id, p.a_tensor_ids, p.b_tensor_ids, p.status, p.module_path).where(
        p.session_id == pair.session_id,
        p.run_b_id == pair.run_b_id,
        p.module_path.startswith(module_a, autoescape=True),
    )
    return {
        (ids_a[0], ids_b[0]): (pair_id, status)
        for pair_id, ids_a, ids_b, status, _ in db.execute(query)
        if len(ids_a) == 1 and len(ids_b) == 1
    }
