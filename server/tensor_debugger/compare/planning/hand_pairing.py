"""Pairing two tensors by hand with a chosen alignment: the alignments that fit two named tensors of a session
(engine.alignment.alignment_choices: transposes, squeezes, shard concatenations, cut rows), for the page to offer
and the API to list, and the check that a chosen one fits."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session as DbSession

from tensor_debugger.engine.alignment import Alignment, Shape, Step, align, alignment_choices
from tensor_debugger.errors import InvalidInputError
from tensor_debugger.store import catalog
from tensor_debugger.store.compared_against import session_reference
from tensor_debugger.store.models import PairRecord, RunRecord, TensorRecord, UnmatchedRecord


@dataclass(frozen=True)
class AlignmentChoice:
    """One alignment that fits: `steps` is what `POST /api/sessions/{id}/pairs` takes as `alignment`."""

    words: str
    shape: list[int]  # the aligned shape both sides are read in
    steps: list[Step]
    last_resort: bool  # both flattened: element counts agree, layouts may not
    automatic: bool  # the one the session would pick by itself


@dataclass(frozen=True)
class HandPairChoices:
    """The alignments two tensors could be paired with, cheapest first (none: shapes no view makes agree)."""

    a_name: str
    b_name: str
    run_id: int  # the candidate run
    a_shapes: list[list[int]]  # each shard's
    b_shapes: list[list[int]]
    same_shape: bool  # nothing to choose: the shapes already agree
    choices: list[AlignmentChoice]


def candidate_run(db: DbSession, session_id: int, run_id: int | None) -> RunRecord:
    """The candidate run `run_id`, else the session's first candidate (not a rerun of the reference: its noise
    floor); neither the reference (`session_reference`: a failed first run is not it) nor a failed run.
    InvalidInputError when there is none."""
    session = catalog.get_session(db, session_id)
    reference = session_reference(session.runs)
    run = next(
        (
            r
            for r in session.runs
            if r is not reference
            and r.status != "failed"
            and (r.id == run_id or (run_id is None and r.role != "noise"))
        ),
        None,
    )
    if run is None:
        raise InvalidInputError("the session has no such candidate run")
    return run


def _shapes(db: DbSession, session_id: int, run: RunRecord, name: str, side: str) -> list[Shape]:
    """The shards' shapes of the logical tensor `name` on one side (a = the reference, b = the candidate run),
    unmatched or paired now."""
    run_id = run.id
    if side == "a":
        ids = db.scalar(
            select(UnmatchedRecord.tensor_ids).where(
                UnmatchedRecord.session_id == session_id,
                UnmatchedRecord.other_run_id == run_id,
                UnmatchedRecord.name == name,
            )
        )
        if ids is None:
            ids = db.scalar(
                select(PairRecord.a_tensor_ids).where(
                    PairRecord.session_id == session_id, PairRecord.run_b_id == run_id, PairRecord.a_name == name
                )
            )
    else:
        ids = db.scalar(
            select(UnmatchedRecord.tensor_ids).where(
                UnmatchedRecord.session_id == session_id, UnmatchedRecord.run_id == run_id, UnmatchedRecord.name == name
            )
        )
        if ids is None:
            ids = db.scalar(
                select(PairRecord.b_tensor_ids).where(
                    PairRecord.session_id == session_id, PairRecord.run_b_id == run_id, PairRecord.b_name == name
                )
            )
    if not ids:
        who = "reference" if side == "a" else f"candidate run {run.label!r}"
        raise InvalidInputError(f"the {who} has no tensor named {name!r}")
    shapes: dict[int, list[int]] = dict(
        db.execute(select(TensorRecord.id, TensorRecord.shape).where(TensorRecord.id.in_(ids))).all()
    )
    return [tuple(shapes[i]) for i in ids]


def hand_pair_choices(
    db: DbSession, session_id: int, a_name: str, b_name: str, run_id: int | None = None
) -> HandPairChoices:
    run = candidate_run(db, session_id, run_id)
    shapes_a, shapes_b = _shapes(db, session_id, run, a_name, "a"), _shapes(db, session_id, run, b_name, "b")
    automatic = align(shapes_a, shapes_b)
    choices = [
        AlignmentChoice(
            c.words(),
            list(c.shape),
            list(c.steps),
            c.last_resort,
            automatic is not None and c.key() == automatic.key(),
        )
        for c in alignment_choices(shapes_a, shapes_b)
    ]
    return HandPairChoices(
        a_name,
        b_name,
        run.id,
        [list(s) for s in shapes_a],
        [list(s) for s in shapes_b],
        automatic is not None and not automatic.steps,
        choices,
    )


def check_choice(db: DbSession, session_id: int, a_name: str, b_name: str, run: RunRecord, steps: list[Step]) -> None:
    """InvalidInputError unless `steps` align the two named tensors."""
    shapes_a, shapes_b = _shapes(db, session_id, run, a_name, "a"), _shapes(db, session_id, run, b_name, "b")
    try:
        Alignment.from_steps(shapes_a, shapes_b, steps)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InvalidInputError(f"this alignment does not fit {a_name!r} and {b_name!r}: {exc}") from None
