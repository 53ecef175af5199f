"""The rows pair reports are built from, read as light rows (not ORM objects) with their JSON columns fetched as
text and decoded by msgspec, typed where their shape is known. SQLAlchemy's JSON type ran `json.loads` per column
into dicts and the statistics were then copied field by field into their dataclass; msgspec decodes the stored
statistics straight into the frozen dataclass, skipping the histogram a summary does not show. For a session of
2,002 pairs the report's CPU time fell by about half (bench/RESULTS.md, "Pages")."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
from sqlalchemy import Text, cast, select
from sqlalchemy.orm import Session as DbSession

from tensor_debugger.compare.reports.pair_stats import PairStatsSummary
from tensor_debugger.compare.reports.summary_reports import SummaryReport
from tensor_debugger.compare.reports.where_reports import StoredWhere
from tensor_debugger.engine.error_spans import ErrorSpan
from tensor_debugger.store.models import ComparisonResultRecord, PairRecord, RunRecord, TensorRecord

# msgspec's decoders hold no data, only the target type's compiled description (as a compiled regex would)
_IDS = msgspec.json.Decoder(list[int])
_ANY = msgspec.json.Decoder()
_SUMMARY = msgspec.json.Decoder(PairStatsSummary)
_WHERE = msgspec.json.Decoder(StoredWhere)
_VERDICT = msgspec.json.Decoder(SummaryReport | None)


@dataclass(frozen=True, slots=True)
class ResultRow:
    """A result's statistics as summaries show them, and where inside the pair its error is (null: not stored)."""

    stats: PairStatsSummary
    where: list[ErrorSpan] | None


@dataclass(frozen=True, slots=True)
class TensorRow:
    """What a pair shows of each of its tensors."""

    id: int
    name: str
    shape: list[int]
    dtype: str
    source: str | None  # a captured op's caller, "<file>:<line>"


@dataclass(frozen=True, slots=True)
class PairRow:
    """A pair's columns that its report reads (the names of PairRecord's, which pair_reports also accepts)."""

    id: int
    position: int
    name: str
    layer: int | None
    stage: str | None
    strategy: str
    a_name: str
    b_name: str
    a_tensor_ids: list[int]
    b_tensor_ids: list[int]
    alignment: dict[str, Any] | None  # the column's JSON as is (`Alignment.to_json`): its steps key the cache
    alignment_overridden: bool
    status: str
    result_id: int | None
    error: str | None
    module_path: str | None
    place: str | None
    summary: SummaryReport | None
    run_a_id: int
    run_b_id: int


def _text(column: Any) -> Any:
    """A JSON column as the text stored (decoded here, not by SQLAlchemy's JSON type), under its own name."""
    return cast(column, Text).label(column.key)


def _json(raw: str | None) -> Any:
    return None if raw is None else _ANY.decode(raw)


def _verdict(raw: str | None) -> SummaryReport | None:
    return None if raw is None else _VERDICT.decode(raw)


def read_pairs(db: DbSession, session_id: int) -> list[PairRow]:
    """The session's pairs in execution order."""
    p = PairRecord
    plain = (p.id, p.position, p.name, p.layer, p.stage, p.strategy, p.a_name, p.b_name)
    rest = (p.alignment_overridden, p.status, p.result_id, p.error, p.module_path, p.place)
    json_columns = (p.a_tensor_ids, p.b_tensor_ids, p.alignment, p.summary)
    rows: Sequence[Any] = db.execute(
        select(*plain, *rest, p.run_a_id, p.run_b_id, *(_text(c) for c in json_columns))
        .where(p.session_id == session_id)
        .order_by(p.position)
    ).all()
    # pairs of one shape share their alignment's text: decoded once, the dict shared (reports only read it)
    alignments = {raw: _json(raw) for raw in {r[-2] for r in rows}}
    return [
        PairRow(
            *(*r[:8], _IDS.decode(r[-4]), _IDS.decode(r[-3]), alignments[r[-2]], *r[8:14], _verdict(r[-1]), *r[14:16])
        )
        for r in rows
    ]


_FEW_TENSORS = 200  # up to this many, the tensors are read by their ids


def read_tensors(db: DbSession, pairs: Sequence[Any], session_id: int | None = None) -> dict[int, TensorRow]:
    """The tensors of `pairs` (anything with `a_tensor_ids` and `b_tensor_ids`), by id. With `session_id` (the
    pairs' session), one statement of a fixed shape reads its runs' tensors, instead of one with a parameter per
    tensor: 9,574 of them for a 2,000-module trace, whose expansion alone took 0.14 s a request."""
    ids = {i for p in pairs for i in (*p.a_tensor_ids, *p.b_tensor_ids)}
    if not ids:
        return {}
    t = TensorRecord
    columns = (t.id, t.name, _text(t.shape), t.dtype, t.source)
    if session_id is not None and len(ids) > _FEW_TENSORS:
        runs = select(RunRecord.id).where(RunRecord.session_id == session_id).scalar_subquery()
        rows = [r for r in db.execute(select(*columns).where(t.run_id.in_(runs))).all() if r[0] in ids]
    else:
        rows = list(db.execute(select(*columns).where(t.id.in_(ids))).all())
    shapes = {raw: _IDS.decode(raw) for raw in {r[2] for r in rows}}  # a model repeats a few shapes
    return {r[0]: TensorRow(r[0], r[1], shapes[r[2]], r[3], r[4]) for r in rows}


class StatsCache:
    """Decoded statistics of the comparison cache's results, by result id, kept by one process (Services) for the
    pages and the API. A result row is written once and never changed or deleted (its key names everything its
    statistics depend on), so an entry never goes stale: no invalidation, whichever process wrote the row.
    Bounded: past `limit` entries it starts again (about 1 kB each)."""

    def __init__(self, limit: int = 50_000) -> None:
        self.limit = limit
        self.entries: dict[int, ResultRow] = {}

    def read(self, db: DbSession, result_ids: Collection[int]) -> dict[int, ResultRow]:
        """The statistics of these results: those not kept yet read (and kept), the others from memory."""
        entries = self.entries
        missing = [i for i in result_ids if i not in entries]
        if missing:
            read = read_stats(db, missing)
            if len(entries) + len(read) > self.limit:
                entries = self.entries = {}
            entries.update(read)
        return {i: entries[i] for i in result_ids if i in entries}


def read_stats(db: DbSession, result_ids: Collection[int]) -> dict[int, ResultRow]:
    """The statistics of the comparison cache's results, by id (the histogram, which summaries leave out, skipped),
    with their `where`."""
    if not result_ids:
        return {}
    r = ComparisonResultRecord
    rows = db.execute(select(r.id, _text(r.stats)).where(r.id.in_(result_ids)))
    return {row[0]: ResultRow(_SUMMARY.decode(row[1]), _WHERE.decode(row[1]).where) for row in rows}


def read_rank_mismatches(db: DbSession, result_ids: Collection[int]) -> dict[int, list[int]]:
    """Per result (of a replicated pair: aligned dim 0 is the rank), the elements outside the tolerance in each rank's
    copy, where its profile along dim 0 is kept (compare/compute/pending.py keeps it for a failing replicated pair)."""
    if not result_ids:
        return {}
    r = ComparisonResultRecord
    rows = db.execute(select(r.id, _text(r.profiles)).where(r.id.in_(result_ids), r.profiles.is_not(None)))
    found: dict[int, list[int]] = {}
    for result_id, raw in rows:
        rank = (_json(raw) or {}).get("0")
        if rank is not None:
            found[result_id] = [int(m) for m in rank["mismatched"]]
    return found
