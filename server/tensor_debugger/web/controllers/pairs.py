from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from litestar import Controller, Response, delete, get, post, put
from litestar.params import Parameter

from tensor_debugger.compare.pair_reports import pair_detail, session_pairs
from tensor_debugger.compare.slices import parse_slice_request, read_slice
from tensor_debugger.engine.alignment import Alignment, Step
from tensor_debugger.errors import InvalidInputError, NotFoundError
from tensor_debugger.services import Services
from tensor_debugger.store import catalog
from tensor_debugger.store.models import PairOverrideRecord, PairRecord


@dataclass
class ManualPair:
    a_name: str  # the reference run's tensor
    b_name: str  # the candidate run's tensor
    run_id: int | None = None  # the candidate run; the session's second run when left out


@dataclass
class AlignmentOverride:
    steps: list[dict[str, Any]] = field(default_factory=list)


class SessionPairsController(Controller):
    path = "/api/sessions/{session_id:int}"
    tags = ["pairs"]

    @get("/pairs", sync_to_thread=True)
    def list_pairs(self, services: Services, session_id: int) -> dict[str, Any]:
        """Pairs in execution order with their statistics and verdicts, the unmatched tensors of each run, the
        first divergence and progress (pairs done of total: finished pairs are served while others compute)."""
        with services.sessions() as db:
            catalog.get_session(db, session_id)
            return session_pairs(db, session_id, modules=True)

    @get("/first-divergence", sync_to_thread=True)
    def first_divergence(self, services: Services, session_id: int) -> dict[str, Any]:
        with services.sessions() as db:
            catalog.get_session(db, session_id)
            report = session_pairs(db, session_id)
        return {"first_divergence": report["first_divergence"], "progress": report["progress"]}

    @post("/pairs", sync_to_thread=True, status_code=201)
    def pair_by_hand(self, services: Services, session_id: int, data: ManualPair) -> dict[str, Any]:
        """Pair two tensors by hand; manual pairs persist and win over every automatic strategy."""
        with services.sessions.begin() as db:
            session = catalog.get_session(db, session_id)
            candidates = [r for r in session.runs if r.position > 0]
            run = next((r for r in candidates if data.run_id in (None, r.id)), None)
            if run is None:
                raise InvalidInputError("the session has no such candidate run")
            db.add(PairOverrideRecord(session_id=session_id, run_b_id=run.id, action="pair",
                                      a_name=data.a_name, b_name=data.b_name))
        services.plan(session_id)
        with services.sessions() as db:
            report = session_pairs(db, session_id)
        made = [p for p in report["pairs"] if p["a"]["name"] == data.a_name and p["b"]["name"] == data.b_name]
        if not made:
            raise InvalidInputError(f"no unmatched tensors named {data.a_name!r} and {data.b_name!r} to pair")
        pair: dict[str, Any] = made[0]
        return pair


@dataclass
class PairOrder:
    pairs: list[str]  # "reference name|candidate name" of each pair, in the order wanted


class SessionOrderController(Controller):
    path = "/api/sessions/{session_id:int}/order"
    tags = ["pairs"]

    @put("/", sync_to_thread=True)
    def set_order(self, services: Services, session_id: int, data: PairOrder) -> dict[str, Any]:
        """Keep the user's order of pairs (pairs it does not name follow in execution order)."""
        with services.sessions.begin() as db:
            catalog.get_session(db, session_id).pair_order = list(data.pairs)
        return {"pairs": data.pairs}

    @delete("/", sync_to_thread=True)
    def reset_order(self, services: Services, session_id: int) -> None:
        with services.sessions.begin() as db:
            catalog.get_session(db, session_id).pair_order = None


class PairController(Controller):
    path = "/api/pairs"
    tags = ["pairs"]

    @get("/{pair_id:int}", sync_to_thread=True)
    def show_pair(self, services: Services, pair_id: int) -> dict[str, Any]:
        """Statistics (with the histogram of |difference| per decade), shapes, alignment steps and the argmax."""
        with services.sessions() as db:
            return pair_detail(db, services.comparisons, pair_id)

    @get("/{pair_id:int}/argmax", sync_to_thread=True)
    def argmax(self, services: Services, pair_id: int) -> dict[str, Any] | None:
        with services.sessions() as db:
            detail = pair_detail(db, services.comparisons, pair_id)
        return detail["argmax"]  # type: ignore[no-any-return]

    @get("/{pair_id:int}/slice", sync_to_thread=True)
    def slice_values(
        self, services: Services, pair_id: int,
        index: str = Parameter(default="", description="one entry per aligned dim: an integer, or ':' for a "
                               "window dim (one or two)"),
        start: str = Parameter(default="", description="window start per ':' dim, comma separated"),
        count: str = Parameter(default="", description="window length per ':' dim (at most 4096)"),
    ) -> dict[str, Any]:
        """Values of both runs and their difference (candidate - reference) in a window of the aligned tensors,
        reading only the chunks that intersect it."""
        with services.sessions() as db:
            pair = _pair(db, pair_id)
            view_a, view_b, alignment = services.comparisons.views(db, pair)
            request = parse_slice_request(alignment.shape, index, start, count)
            return read_slice(view_a, view_b, request)

    @delete("/{pair_id:int}", sync_to_thread=True)
    def unpair(self, services: Services, pair_id: int) -> None:
        """Undo a pair: both tensors become unmatched, and stay so when the session is paired again."""
        with services.sessions.begin() as db:
            pair = _pair(db, pair_id)
            session_id = pair.session_id
            db.add(PairOverrideRecord(session_id=session_id, run_b_id=pair.run_b_id, action="unpair",
                                      a_name=pair.a_name, b_name=pair.b_name))
            db.query(PairOverrideRecord).filter_by(session_id=session_id, run_b_id=pair.run_b_id, action="pair",
                                                   a_name=pair.a_name, b_name=pair.b_name).delete()
        services.plan(session_id)

    @put("/{pair_id:int}/alignment", sync_to_thread=True)
    def override_alignment(self, services: Services, pair_id: int, data: AlignmentOverride) -> Response[Any]:
        """Replace the automatic alignment with explicit steps (the `alignment_steps` of a pair's detail)."""
        with services.sessions.begin() as db:
            pair = _pair(db, pair_id)
            side_a, side_b = services.comparisons.tensors_of(db, pair)
            shapes_a, shapes_b = [tuple(t.shape) for t in side_a], [tuple(t.shape) for t in side_b]
            try:
                Alignment.from_steps(shapes_a, shapes_b, [Step.from_json(s) for s in data.steps])
            except (ValueError, KeyError, TypeError) as exc:
                raise InvalidInputError(f"these steps do not align the pair: {exc}") from None
            _clear_alignment(db, pair)
            db.add(PairOverrideRecord(session_id=pair.session_id, run_b_id=pair.run_b_id, action="align",
                                      a_name=pair.a_name, b_name=pair.b_name, steps=data.steps))
            session_id, names = pair.session_id, (pair.a_name, pair.b_name)
        services.plan(session_id)
        return Response(_find(services, session_id, names))

    @delete("/{pair_id:int}/alignment", sync_to_thread=True, status_code=200)
    def reset_alignment(self, services: Services, pair_id: int) -> dict[str, Any]:
        with services.sessions.begin() as db:
            pair = _pair(db, pair_id)
            _clear_alignment(db, pair)
            session_id, names = pair.session_id, (pair.a_name, pair.b_name)
        services.plan(session_id)
        return _find(services, session_id, names)


def _pair(db: Any, pair_id: int) -> PairRecord:
    pair = db.get(PairRecord, pair_id)
    if pair is None:
        raise NotFoundError(f"no pair with id {pair_id}")
    return pair  # type: ignore[no-any-return]


def _clear_alignment(db: Any, pair: PairRecord) -> None:
    db.query(PairOverrideRecord).filter_by(session_id=pair.session_id, run_b_id=pair.run_b_id, action="align",
                                           a_name=pair.a_name, b_name=pair.b_name).delete()


def _find(services: Services, session_id: int, names: tuple[str, str]) -> dict[str, Any]:
    with services.sessions() as db:
        report = session_pairs(db, session_id)
    return next(p for p in report["pairs"] if (p["a"]["name"], p["b"]["name"]) == names)



