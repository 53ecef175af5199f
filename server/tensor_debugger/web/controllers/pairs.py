from __future__ import annotations

from typing import Annotated, Any

import msgspec
from litestar import Controller, delete, get, post, put
from litestar.di import NamedDependency
from litestar.params import FromPath, QueryParameter

from tensor_debugger.compare.compute.profiles import ErrorProfile, error_profile
from tensor_debugger.compare.planning.hand_pairing import HandPairChoices, hand_pair_choices
from tensor_debugger.compare.planning.sides import views
from tensor_debugger.compare.reports.pair_report import ArgmaxReport, PairDetail, PairReport
from tensor_debugger.compare.reports.pair_reports import DivergenceReport, SessionPairs, pair_detail, session_pairs
from tensor_debugger.compare.reports.session_profiles import SessionProfiles, parse_dim, session_profiles
from tensor_debugger.compare.reports.slices import SliceReport, parse_slice_request, read_slice
from tensor_debugger.engine.alignment import Step
from tensor_debugger.errors import InvalidInputError, NotFoundError
from tensor_debugger.services import Services
from tensor_debugger.store import catalog
from tensor_debugger.store.models import PairRecord
from tensor_debugger.web.error_responses import CHANGES, JSON_BODY, READS_VALUES, error_responses
from tensor_debugger.web.json_bodies import JSON_BODY_LIMIT, StrictBody

WRITE = error_responses(*CHANGES, *JSON_BODY, 404)  # a JSON body about a session or pair
DELETE = error_responses(*CHANGES, 404)
NAMES_TENSORS = "names a tensor or a candidate run the session does not hold, or "
ALIGNMENT = "gives alignment steps that do not fit the two tensors' shapes"


class ManualPair(msgspec.Struct, forbid_unknown_fields=True):
    a_name: str  # the reference run's tensor
    b_name: str  # the candidate run's tensor
    run_id: int | None = None  # the candidate run; the session's second run when left out
    # the steps of the alignment chosen (a choice's `steps` from GET .../alignments); left out: the automatic one
    alignment: list[Step] | None = None


class AlignmentOverride(msgspec.Struct, forbid_unknown_fields=True):
    steps: list[Step] = msgspec.field(default_factory=list)


class SessionPairsController(Controller):
    path = "/api/sessions/{session_id:int}"
    tags = ["pairs"]

    @get("/pairs", sync_to_thread=True, responses=error_responses(404))
    def list_pairs(self, services: NamedDependency[Services], session_id: FromPath[int]) -> SessionPairs:
        """Pairs in execution order with their statistics and verdicts, the unmatched tensors of each run (a
        reference tensor's with its place in execution order, whether the user allowed it, and the closest
        candidates a hand pairing could take), the first divergence, progress (pairs done of total: finished pairs
        are served while others compute), coverage and the session's verdict."""
        with services.sessions() as db:
            catalog.get_session(db, session_id)
            return session_pairs(db, session_id, modules=True, cache=services.stats, closest=True)

    @get("/first-divergence", sync_to_thread=True, responses=error_responses(404))
    def first_divergence(self, services: NamedDependency[Services], session_id: FromPath[int]) -> DivergenceReport:
        with services.sessions() as db:
            catalog.get_session(db, session_id)
            report = session_pairs(db, session_id, cache=services.stats)
        return DivergenceReport(report.first_divergence, report.progress, report.verdict, report.coverage)

    @get(
        "/profiles",
        sync_to_thread=True,
        responses=error_responses(
            404, depends_on_state="names a dimension no pair has (not a position, nor a name the session's dims give)"
        ),
    )
    def profiles(
        self,
        services: NamedDependency[Services],
        session_id: FromPath[int],
        dim: Annotated[
            str,
            QueryParameter(
                description="the aligned dimension to profile (0 for the first), or a dimension's name (the "
                "session's dims): each pair's own dimension of that name",
                max_length=64,
            ),
        ],
    ) -> SessionProfiles:
        """For every pair with aligned dimension `dim` (or a dimension named `dim`), in execution order: its largest
        and mean |difference| per index of that dimension (each pair's profile computed once and kept with its
        result); the pairs without it are listed as skipped, with why."""
        with services.sessions() as db:
            return session_profiles(db, services.context, session_id, parse_dim(dim))

    @get(
        "/alignments",
        sync_to_thread=True,
        responses=error_responses(404, depends_on_state=NAMES_TENSORS + "names two tensors that are already paired"),
    )
    def alignment_choices(
        self,
        services: NamedDependency[Services],
        session_id: FromPath[int],
        a_name: Annotated[str, QueryParameter(description="the reference run's tensor")],
        b_name: Annotated[str, QueryParameter(description="the candidate run's tensor")],
        run_id: Annotated[int | None, QueryParameter(description="the candidate run (default: the first)")] = None,
    ) -> HandPairChoices:
        """The alignments two tensors could be paired by hand with (transposes and other permutations, size-1
        dims dropped, shard concatenations, cut rows; flattening only when nothing else fits), cheapest first."""
        with services.sessions() as db:
            return hand_pair_choices(db, session_id, a_name, b_name, run_id)

    @post(
        "/pairs",
        sync_to_thread=True,
        status_code=201,
        request_max_body_size=JSON_BODY_LIMIT,
        responses=error_responses(
            *CHANGES, *JSON_BODY, 404, depends_on_state=NAMES_TENSORS + "names a paired tensor, or " + ALIGNMENT
        ),
    )
    def pair_by_hand(
        self, services: NamedDependency[Services], session_id: FromPath[int], data: StrictBody[ManualPair]
    ) -> PairReport:
        """Pair two tensors by hand; manual pairs persist and win over every automatic strategy."""
        made = services.actions.pair_by_hand(session_id, data.a_name, data.b_name, data.run_id, data.alignment)
        if made is None:
            raise InvalidInputError(f"no unmatched tensors named {data.a_name!r} and {data.b_name!r} to pair")
        return made


class PairOrder(msgspec.Struct, forbid_unknown_fields=True):
    pairs: list[str]  # "reference name|candidate name" of each pair, in the order wanted


class SessionOrderController(Controller):
    path = "/api/sessions/{session_id:int}/order"
    tags = ["pairs"]

    @put("/", sync_to_thread=True, request_max_body_size=JSON_BODY_LIMIT, responses=WRITE)
    def set_order(
        self, services: NamedDependency[Services], session_id: FromPath[int], data: StrictBody[PairOrder]
    ) -> PairOrder:
        """Keep the user's order of pairs (pairs it does not name follow in execution order)."""
        return PairOrder(services.actions.set_order(session_id, data.pairs))

    @delete("/", sync_to_thread=True, responses=DELETE)
    def reset_order(self, services: NamedDependency[Services], session_id: FromPath[int]) -> None:
        services.actions.reset_order(session_id)


class PairController(Controller):
    path = "/api/pairs"
    tags = ["pairs"]

    @get("/{pair_id:int}", sync_to_thread=True, responses=error_responses(404, *READS_VALUES))
    def show_pair(self, services: NamedDependency[Services], pair_id: FromPath[int]) -> PairDetail:
        """Statistics (with the histogram of |difference| per decade), shapes, alignment steps and the argmax."""
        with services.sessions() as db:
            return pair_detail(db, services.context, pair_id)

    @get("/{pair_id:int}/argmax", sync_to_thread=True, responses=error_responses(404, *READS_VALUES))
    def argmax(self, services: NamedDependency[Services], pair_id: FromPath[int]) -> ArgmaxReport | None:
        with services.sessions() as db:
            return pair_detail(db, services.context, pair_id).argmax

    @get(
        "/{pair_id:int}/profile",
        sync_to_thread=True,
        responses=error_responses(
            404,
            *READS_VALUES,
            depends_on_state="names a dimension past the pair's aligned rank, or the pair has no element values",
        ),
    )
    def profile(
        self,
        services: NamedDependency[Services],
        pair_id: FromPath[int],
        dim: Annotated[int, QueryParameter(ge=0, description="the aligned dimension to profile (0 for the first)")],
    ) -> ErrorProfile:
        """Per index of aligned dimension `dim`: the largest and the mean |difference| and the elements outside the
        tolerance, read chunk by chunk on first request and kept with the pair's result."""
        with services.sessions() as db:
            return error_profile(db, services.context, pair_id, dim)

    @get(
        "/{pair_id:int}/slice",
        sync_to_thread=True,
        responses=error_responses(
            404,
            409,
            *READS_VALUES,
            depends_on_state="gives an index, start or count that does not fit the pair's aligned shape (one entry "
            "per dimension, within its size, one or two ':' windows of at most 65,536 values)",
        ),
    )
    def slice_values(
        self,
        services: NamedDependency[Services],
        pair_id: FromPath[int],
        index: Annotated[
            str,
            QueryParameter(description="one entry per aligned dim: an integer, or ':' for a window dim (one or two)"),
        ] = "",
        start: Annotated[str, QueryParameter(description="window start per ':' dim, comma separated")] = "",
        count: Annotated[str, QueryParameter(description="window length per ':' dim (at most 4096)")] = "",
    ) -> SliceReport:
        """Values of both runs and their difference (candidate - reference) in a window of the aligned tensors,
        reading only the chunks that intersect it; 409 for an incomparable pair (no aligned values)."""
        with services.sessions() as db:
            pair = _pair(db, pair_id)
            view_a, view_b, alignment = views(services.store, db, pair)
            request = parse_slice_request(alignment.shape, index, start, count)
            return read_slice(view_a, view_b, request)

    @delete("/{pair_id:int}", sync_to_thread=True, responses=DELETE)
    def unpair(self, services: NamedDependency[Services], pair_id: FromPath[int]) -> None:
        """Undo a pair: both tensors become unmatched, and stay so when the session is paired again."""
        services.actions.unpair(pair_id)

    @put(
        "/{pair_id:int}/alignment",
        sync_to_thread=True,
        request_max_body_size=JSON_BODY_LIMIT,
        responses=error_responses(*CHANGES, *JSON_BODY, 404, depends_on_state=ALIGNMENT),
    )
    def override_alignment(
        self, services: NamedDependency[Services], pair_id: FromPath[int], data: StrictBody[AlignmentOverride]
    ) -> PairReport:
        """Replace the automatic alignment with explicit steps (the `alignment_steps` of a pair's detail)."""
        return services.actions.set_alignment(pair_id, data.steps)

    @delete("/{pair_id:int}/alignment", sync_to_thread=True, status_code=200, responses=DELETE)
    def reset_alignment(self, services: NamedDependency[Services], pair_id: FromPath[int]) -> PairReport:
        return services.actions.clear_alignment(pair_id)


def _pair(db: Any, pair_id: int) -> PairRecord:
    pair = db.get(PairRecord, pair_id)
    if pair is None:
        raise NotFoundError(f"no pair with id {pair_id}")
    return pair  # type: ignore[no-any-return]
