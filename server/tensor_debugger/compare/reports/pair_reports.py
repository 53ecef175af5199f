"""Reports of pairs, first divergences and unmatched tensors: typed, frozen structures for the API (which
documents them in its OpenAPI schema), the CLI, the CSV export and the pages alike."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from msgspec import UnsetType
from sqlalchemy import select
from sqlalchemy.orm import Session as DbSession

from tensor_debugger.compare.compute.profiles import error_profile
from tensor_debugger.compare.context import CompareContext
from tensor_debugger.compare.planning.op_pairs import AMBIGUOUS_STRATEGY, pairing_note
from tensor_debugger.compare.planning.plan import capture_scope, outside_scope
from tensor_debugger.compare.planning.sides import reference_cut_of, views
from tensor_debugger.compare.reports.before_divergence import (
    crossed_before,
    held_before_of,
    lowered_first,
    model_checks,
    outputs_agree,
    recorded_early,
)
from tensor_debugger.compare.reports.compare_report import (
    CrossedOps,
    HeldBefore,
    LoweredFirst,
    ModelCheck,
    RecordedEarly,
    nothing_whole_words,
)
from tensor_debugger.compare.reports.coverage import (
    ClosestCandidate,
    Coverage,
    OutOfStep,
    RunCoverage,
    RunNotCompared,
    SessionVerdict,
    Unpaired,
    closest_candidates,
    session_verdict,
)
from tensor_debugger.compare.reports.divergence_words import (
    FOUND_BY_FIND_DIVERGENCE,
    OUTPUTS_AGREE,
    RESHAPED_WHY,
    changed_words,
    checks_words,
    crossed_words,
    early_words,
    holds_words,
    lowered_words,
)
from tensor_debugger.compare.reports.full_values import (
    FullValuesRun,
    full_values_runs,
    rests_on_summaries,
    summary_words,
    values_words,
    with_full_values,
)
from tensor_debugger.compare.reports.guessed_pairs import guess_words, guessed_by
from tensor_debugger.compare.reports.module_reports import (
    ModuleReport,
    StageCulpritReport,
    StageRanking,
    module_report,
    pair_error,
    stage_culprits,
)
from tensor_debugger.compare.reports.noise import NOISE_FACTOR, Rule, noise_judges, summary_noise_verdict
from tensor_debugger.compare.reports.one_sided import candidate_only_before
from tensor_debugger.compare.reports.pair_report import (
    ArgmaxReport,
    ArgmaxSide,
    PairDetail,
    PairReport,
    PairShapes,
    PairSide,
    ReplicaReport,
)
from tensor_debugger.compare.reports.pair_rows import (
    ResultRow,
    StatsCache,
    read_pairs,
    read_rank_mismatches,
    read_stats,
    read_tensors,
)
from tensor_debugger.compare.reports.pair_stats import PairStatsFull
from tensor_debugger.compare.reports.pass_words import on_printed_statistics
from tensor_debugger.compare.reports.progress import PairProgress
from tensor_debugger.compare.reports.reshaped import reshaped_pairs
from tensor_debugger.compare.reports.summary_reports import SummaryReport, summary_report
from tensor_debugger.compare.reports.where_reports import WhereEntry, named_where
from tensor_debugger.compare.reports.worst_pairs import WorstPairs, worst_pairs
from tensor_debugger.engine.alignment import ReferenceCut, cut_verdict, replicas_of, stored_steps
from tensor_debugger.engine.culprits import MIN_ADDED_ERROR, RANKED_ENOUGH
from tensor_debugger.engine.error_spans import ErrorSpan
from tensor_debugger.engine.metrics import Number, PairStats, json_number, parse_number
from tensor_debugger.engine.op_alignment import op_call, out_of_step
from tensor_debugger.engine.stages import stages_ordered, unordered_words
from tensor_debugger.errors import NotFoundError, is_second_tensor
from tensor_debugger.ingest.traces import ModuleTree
from tensor_debugger.store.compared_against import session_reference
from tensor_debugger.store.models import (
    ComparisonResultRecord,
    PairRecord,
    ProblemRecord,
    RunRecord,
    SessionRecord,
    TensorRecord,
    UnmatchedRecord,
)
from tensor_debugger.store.reports import PairingStrategy, PairStatus, parse_strategy

_STATUSES = {str(s): s for s in PairStatus}  # a dict lookup: calling the enum took 10% of a session's report


@dataclass(frozen=True)
class FirstDivergence:
    pair_id: int
    name: str
    layer: int | None
    stage: str | None
    max_abs_diff: Number | None
    argmax: list[int] | None
    where: list[WhereEntry] | None  # the pair's `where`
    # where a capture with level="op" recorded the op: the line that called it, in the reference and the candidate
    reference_source: str | None = None
    candidate_source: str | None = None
    # the reference tensors with no partner in this candidate that come before it in execution order (not those
    # the user allowed to stay unpaired): the divergence may have begun in one of them
    unmatched_before: list[str] = field(default_factory=list)
    # "summary" where the verdict rests on summaries (a capture with values="summary"), with its words
    # ("from summaries: ..."); None where element values were compared
    basis: str | None = None
    summary_reason: str | None = None
    module_path: str | None = None  # the reference tensor's module (an op's: "<module call>/<op>#<n>")
    # the candidate's tensors without partner between the pair before it and it ("name (file:line)"): an op the
    # candidate runs and the reference does not, where the divergence may have begun (compare/reports/one_sided.py)
    candidate_only_before: list[str] = field(default_factory=list)
    # the first pair before it whose values differ at all though within tolerance (max |diff| above 0, or summaries'
    # hashes that differ), "name (file:line)": where a difference too small to fail began; None where none did
    first_changed: str | None = None
    first_changed_on_summaries: bool = False  # that pair was judged on summaries only: "within tolerance" unknown
    # False where no execution order is known (a failing pair without a stage or a module: a state dict's weights,
    # files named without `{layer}_{stage}`): the pair is the first failing one listed, not the first to fail, and
    # nothing is said of what came before it
    in_execution_order: bool = True
    # where in_execution_order is False because the failing stages of its layer have no known order, why in words
    order_note: str | None = None
    # where its partner was guessed (`guessed_pairs`): the strategy ("shape", "fuzzy 0.86") and the candidate's tensor
    paired_by: str | None = None
    candidate_name: str | None = None
    # where it is a module's input and a side's run names no line that passed it (`input_source_note`): why
    source_note: str | None = None
    place: str | None = None  # the pair's place in its module ("inputs_args_0", "outputs"); None for a dump's
    # ops before it in its module call that paired by content across call indices (two slices swapped in use), with
    # both sides' lines: compare/reports/before_divergence.py, by find_divergence's rule
    crossed_before: list[CrossedOps] = field(default_factory=list)
    # where the candidate's lower precision begins (the first of its captured tensors in a less precise float dtype
    # where the reference's is not); None where there is none
    lowered_first: LoweredFirst | None = None
    # where it is a module's output of another shape on each side (compare/reports/reshaped.py): the two shapes,
    # the reference's and the candidate's (no element values compared); else None
    shapes: list[list[int]] | None = None
    # the candidate's tensors just before it that pair with tensors the reference records only after it, each with
    # its line and its partner's: compare/reports/before_divergence.py, by find_divergence's rule
    candidate_early_before: list[RecordedEarly] = field(default_factory=list)
    # the reference's tensor before it that holds, bit for bit, what the candidate's holds there; None where none
    candidate_holds: HeldBefore | None = None
    # what find_divergence can check of it that the session cannot (it needs the models)
    find_divergence_checks: list[ModelCheck] = field(default_factory=list)
    # whether every one of the models' own outputs is bit-identical to the candidate's: it does not reach them
    outputs_agree: bool = False
    # the pairs before it in execution order that were not compared (incomparable, errored, not compared yet), each
    # "name (why)": the divergence may have begun in one of them (not said where the order is not known)
    not_compared_before: list[str] = field(default_factory=list)

    @property
    def outputs_agree_words(self) -> str:
        """`outputs_agree` in the words find_divergence's answer says it with ("" where they do not)."""
        return OUTPUTS_AGREE if self.outputs_agree else ""

    @property
    def early_words(self) -> str:
        """`candidate_early_before` in the words find_divergence's answer says it with ("" where none)."""
        return early_words(self.candidate_early_before)

    @property
    def holds_words(self) -> str:
        """`candidate_holds` in the words find_divergence's answer says it with ("" where none)."""
        return holds_words(self.candidate_holds)

    def changed_sentence(self, noise: bool = False) -> str:
        """`first_changed` as a sentence ("" where none); `noise`: it passed by the noise rule."""
        if self.first_changed is None:
            return ""
        words = changed_words(self.first_changed, self.first_changed_on_summaries, noise)
        return f"{words[0].upper()}{words[1:]}."

    @property
    def checks_words(self) -> str:
        """`find_divergence_checks` in one sentence ("" where none)."""
        dtype = self.lowered_first.dtype if self.lowered_first is not None else None
        return checks_words(self.name, self.find_divergence_checks, dtype)

    @property
    def crossed_words(self) -> str:
        """`crossed_before` in the words find_divergence's answer says it with ("" where none)."""
        return crossed_words(self.crossed_before)

    @property
    def guess(self) -> str:
        """Where its partner was guessed, the strategy and the candidate's tensor in words ("" otherwise)."""
        return guess_words(self.paired_by, self.candidate_name) or ""

    @property
    def lowered_words(self) -> str:
        """`lowered_first` in words ("" where none)."""
        return lowered_words(self.lowered_first)

    @property
    def reshaped_why(self) -> str:
        """Where it is a module's output of another shape (`shapes`), why that is a divergence ("" otherwise)."""
        return RESHAPED_WHY if self.shapes is not None else ""


@dataclass(frozen=True)
class UnmatchedReport:
    """A tensor of one run that no tensor of the other run was paired with. `allowed`: the user allowed it to stay
    unpaired (a pairing file's `unpaired`, an unpair by hand, `--allow-unmatched`); `before_position`: a reference
    tensor's place in execution order, the position of the first pair after it (null for a candidate's tensor);
    `closest`: for a reference tensor, the candidate's unpaired tensors a hand pairing could take, closest first
    (the session's page and the API's pairs report fill it)."""

    run_id: int
    run: str | None  # the run's label
    against_run_id: int
    name: str
    tensor_ids: list[int]
    allowed: bool = False
    before_position: int | None = None
    closest: list[ClosestCandidate] = field(default_factory=list)


@dataclass(frozen=True)
class CandidateReport:
    """One candidate run of the session and its own first divergence; `against_run_id`, `against`: the id and label
    of the run it is compared against (the session's reference, or the run it names)."""

    run_id: int
    label: str
    first_divergence: FirstDivergence | None
    against_run_id: int | None = None
    against: str | None = None


@dataclass(frozen=True)
class SessionPairs:
    """Every pair in execution order, the unmatched tensors of each run, the first divergence (the first
    candidate's) and progress; `modules`: the module view of a traced session, when asked for; `candidates`: every
    candidate run in the session's order, each with its first divergence; `worst_pairs`: the ten compared pairs
    with the largest max |diff| and the ten with the lowest cosine, worst first."""

    pairs: list[PairReport]
    first_divergence: FirstDivergence | None
    unmatched: list[UnmatchedReport]
    progress: PairProgress
    modules: ModuleReport | None = None
    # without module traces (and asked for with `modules`): the stages whose added error stands out, largest first
    stage_culprits: list[StageCulpritReport] = field(default_factory=list)
    candidates: list[CandidateReport] = field(default_factory=list)
    worst_pairs: WorstPairs = field(default_factory=WorstPairs)
    # the stages that add the most error, whether or not they stand out (at most 10), largest first
    stage_ranking: list[StageCulpritReport] = field(default_factory=list)
    # asked for with `modules`: "even" where modules or stages add error and none stands out (as a change of
    # precision or of kernels does), "stands out" where a culprit does; None where nothing could be ranked
    error_growth: str | None = None
    # without module traces: where a stage's added error would stand out but its input was not compared, in words
    stage_notes: list[str] = field(default_factory=list)
    stage_noise_notes: list[str] = field(default_factory=list)  # stages that would stand out, within the noise floor
    # what was compared of the reference, and the session's verdict on it (compare/reports/coverage.py)
    coverage: Coverage = field(default_factory=Coverage)
    verdict: SessionVerdict = SessionVerdict.COMPARING
    # the ids of the pairs whose two sides are not one value computed two ways (`coverage.out_of_step`): their
    # status says nothing, they were not compared
    out_of_step: frozenset[int] = frozenset()

    @property
    def on_summaries(self) -> int:
        """How many pairs were judged on summaries alone (a capture with values="summary"): a pass of such a pair
        says only that no difference was found in the summary."""
        return sum(1 for p in self.pairs if summary_basis(p.summary))

    @property
    def on_statistics(self) -> int:
        """How many pairs were judged on a use_repr=True trace's printed statistics (mean, std, min and max): a pass
        of such a pair says only that no difference was found in those."""
        return sum(1 for p in self.pairs if on_printed_statistics(p.summary))

    @property
    def hashes_changed(self) -> PairReport | None:
        """Where no pair of the first candidate diverged: its first pair in execution order that passed on summaries
        (values="summary") whose content hashes differ. Its values differ though its summaries found nothing outside
        tolerance: not a verified pass, and full values of its module settle it. None where there is none, or where
        another run's pair of that tensor was compared element by element (a second capture with full values)."""
        if self.first_divergence is not None or not self.candidates:
            return None
        mine = self.candidates[0].run_id
        changed = next(
            (
                p
                for p in self.pairs
                if p.b.run_id == mine
                and p.status == PairStatus.PASS
                and p.summary is not None
                and p.summary.on_summary
                and p.summary.hashes_differ is True
            ),
            None,
        )
        if changed is None:
            return None
        # a second capture with full values (find_divergence's "candidate (full)", the snippet run) compared that
        # tensor element by element: its verdict there settles it, and is said with that run's
        settled = any(
            q.name == changed.name
            and q.b.run_id != mine
            and q.stats is not None
            and not (q.summary is not None and q.summary.on_summary)
            and q.status in (PairStatus.PASS, PairStatus.FAIL)
            for q in self.pairs
        )
        return None if settled else changed

    def statistics_before(self, first: FirstDivergence | None) -> int:
        """How many of `first`'s candidate's pairs before it passed on printed statistics only (0 where no execution
        order is known, or `first` is None): the divergence may have begun in one of them, unseen."""
        if first is None or not first.in_execution_order:
            return 0
        theirs = next((p for p in self.pairs if p.id == first.pair_id), None)
        if theirs is None:
            return 0
        count = 0
        for p in self.pairs:
            if p.id == first.pair_id:
                return count
            if p.b.run_id == theirs.b.run_id and p.status == PairStatus.PASS and on_printed_statistics(p.summary):
                count += 1
        return count

    @property
    def by_noise(self) -> int:
        """How many pairs the noise rule judged (a rerun in the session, `compare --noise`, or find_divergence's
        precision floor): their verdict is against the rerun's error there, not against the tolerances."""
        return sum(1 for p in self.pairs if p.rule == Rule.NOISE)

    @property
    def not_compared(self) -> list[PairReport]:
        """The pairs that have no verdict and never will as they are: incomparable, or their comparison failed."""
        return [p for p in self.pairs if p.status in (PairStatus.INCOMPARABLE, PairStatus.ERROR)]

    @property
    def nothing_whole(self) -> str:
        """Where no pair has a verdict, what was compared (`compare_report.nothing_whole_words`: the command's line):
        nothing, or the rows compared of the pairs whose reference was cut."""
        judged = [p for p in self.pairs if p.id not in self.out_of_step]
        in_part = [(p.reference_rows.kept, p.reference_rows.rows) for p in judged if p.reference_rows and p.stats]
        return nothing_whole_words(len(judged), in_part)

    @property
    def unmatched_reference(self) -> list[UnmatchedReport]:
        """The reference tensors without partner in a candidate that the user did not allow, in execution order."""
        names = set(self.coverage.unmatched)
        return [u for u in self.unmatched if u.before_position is not None and not u.allowed and u.name in names]

    def candidate_of(self, pair: PairReport) -> str:
        """The label of the pair's candidate run."""
        return next((c.label for c in self.candidates if c.run_id == pair.b.run_id), "")


@dataclass(frozen=True)
class DivergenceReport:
    first_divergence: FirstDivergence | None
    progress: PairProgress
    verdict: SessionVerdict = SessionVerdict.COMPARING  # the session's (compare/reports/coverage.py)
    coverage: Coverage = field(default_factory=Coverage)


def _side(pair: Any, side: str, tensors: dict[int, Any]) -> PairSide:
    ids = pair.a_tensor_ids if side == "a" else pair.b_tensor_ids
    shards = [tensors[i] for i in ids]
    shape = list(shards[0].shape)
    for step in (pair.alignment or {}).get("steps", []):
        if step["side"] == side and step["kind"] == "concat":
            shape = list(step["shape"])
    return PairSide(
        pair.a_name if side == "a" else pair.b_name,
        shape,
        shards[0].dtype,
        len(shards),
        list(ids),
        pair.run_a_id if side == "a" else pair.run_b_id,
        shards[0].source,
    )


def _replicas(pair: Any, mismatches: dict[int, list[int]]) -> ReplicaReport | None:
    """The pair's replicas (`ReplicaReport`), from its alignment and its result's profile along the rank."""
    found = replicas_of(stored_steps(pair.alignment))
    if found is None:
        return None
    side, ranks = found
    if pair.status == "pass":
        return ReplicaReport(ranks, side, [])
    per_rank = mismatches.get(pair.result_id) if pair.status == "fail" and pair.result_id is not None else None
    return ReplicaReport(ranks, side, None if per_rank is None else [k for k, m in enumerate(per_rank) if m])


def replica_results(pairs: Any) -> set[int]:
    """The results whose ranks are read for a report: those of failing replicated pairs."""
    return {
        p.result_id
        for p in pairs
        if p.status == "fail" and p.result_id is not None and replicas_of(stored_steps(p.alignment))
    }


def _pair_fields(pair: Any, tensors: dict[int, Any], mismatches: dict[int, list[int]]) -> dict[str, Any]:
    """A PairReport's fields but its statistics and `where`, as the keywords both PairReport and PairDetail (which
    adds its own) are built with. `tensors` rows have `name`, `shape` and `dtype`; `mismatches`: per result of a
    failing replicated pair, the elements outside the tolerance per rank."""
    alignment = pair.alignment or {}
    a, b = _side(pair, "a", tensors), _side(pair, "b", tensors)
    rows = _reference_cut(pair, tensors)
    cut = None if rows is None else rows.words()
    status, error = _STATUSES[pair.status], pair.error
    if status == PairStatus.PASS and cut is not None:  # a row settled before the rule (cut_verdict) held
        settled, error = cut_verdict(True, cut, "summaries" if pair.summary else "tolerance")
        status = PairStatus(settled)
    return {
        "id": pair.id,
        "position": pair.position,
        "name": pair.name,
        "layer": pair.layer,
        "stage": pair.stage,
        "strategy": parse_strategy(pair.strategy),
        "status": status,
        "alignment": alignment.get("words", "no alignment: the shapes cannot be made comparable")
        if pair.alignment is not None
        else f"incomparable: {pair.error}"
        if pair.error  # why, where planning said (a shard one side lacks)
        else f"incomparable: {a.shape} vs {b.shape}",
        "aligned_shape": alignment.get("shape"),
        "alignment_overridden": pair.alignment_overridden,
        "a": a,
        "b": b,
        "error": error,
        "module_path": pair.module_path,
        "place": pair.place,
        "summary": summary_report(pair.summary),
        "rule": "tolerance",
        "noise_max_abs_diff": None,
        "replicas": _replicas(pair, mismatches),
        "pairing_note": pairing_note(pair.strategy),
        "reference_cut": cut,
        "reference_rows": rows,
    }


def _reference_cut(pair: Any, tensors: dict[int, Any]) -> ReferenceCut | None:
    """The reference rows a pair row's alignment cut away, from its reference shards' shapes (`tensors` rows)."""
    if not pair.alignment or any(i not in tensors for i in pair.a_tensor_ids):
        return None
    return reference_cut_of(pair, [tuple(tensors[i].shape) for i in pair.a_tensor_ids])


def pair_report(
    pair: Any,
    tensors: dict[int, Any],
    result: ResultRow | None,
    mismatches: dict[int, list[int]] | None = None,
    dims: dict[str, str] | None = None,
) -> PairReport:
    """`dims`: the session's dimension names (engine/dimension_names.py)."""
    fields = _pair_fields(pair, tensors, mismatches or {})
    stats, spans = (result.stats, result.where) if result is not None else (None, None)
    return PairReport(**fields, stats=stats, where=_where(fields, spans, dims))


def _where(
    fields: dict[str, Any], spans: Sequence[ErrorSpan] | None, dims: dict[str, str] | None
) -> list[WhereEntry] | None:
    if fields["status"] != PairStatus.FAIL:
        return None
    return named_where(spans, dims, (fields["name"], fields["a"].name, fields["b"].name), fields["aligned_shape"])


def session_pairs(
    db: DbSession,
    session_id: int,
    modules: bool = False,
    cache: StatsCache | None = None,
    closest: bool = False,
) -> SessionPairs:
    """Every pair in execution order, the unmatched tensors of each run, the first divergence, progress, coverage
    and the verdict; with `modules`, also the module view of a traced session (its tree and culprits: work the
    other callers skip); with `closest`, each unmatched reference tensor's closest candidates for a hand pairing.
    `cache`: the process's decoded statistics (the pages and the API pass theirs, Services.stats)."""
    judged = _judged_pairs(db, session_id, cache)
    everything, items, ordered_runs = judged.everything, judged.items, judged.runs
    noise_runs, factor = judged.noise_runs, judged.factor
    runs = {r.id: r.label for r in ordered_runs}
    unmatched = [
        UnmatchedReport(
            u.run_id,
            runs.get(u.run_id),
            u.other_run_id,
            u.name,
            list(u.tensor_ids),
            bool(u.allowed),
            u.before_position,
        )
        for u in db.scalars(
            select(UnmatchedRecord)
            .where(UnmatchedRecord.session_id == session_id)
            .order_by(UnmatchedRecord.run_id, UnmatchedRecord.position)
        )
    ]
    # each candidate's tensors are paired with those of the run it is compared against (the session's reference,
    # or the run it names): that run's tensors without partner there are what was not compared
    # as planning takes it: a failed first run is not the reference, the next run is
    reference_run = session_reference(ordered_runs)
    reference = reference_run.id if reference_run is not None else None
    against = {r.id: r.compared_against_id or reference for r in ordered_runs}

    def missed(u: UnmatchedReport) -> bool:
        return u.against_run_id not in noise_runs and u.run_id == against.get(u.against_run_id)

    missing = [u for u in unmatched if missed(u)]
    if closest:
        unmatched = with_closest(db, unmatched, missing)
        missing = [u for u in unmatched if missed(u)]
    compared = {i.b.run_id for i in items}
    # pairs of captured ops out of step: not one value computed two ways, so not compared (no verdict counts them)
    out_of_step: dict[int, str] = {}
    for run_id in compared:
        out_of_step |= _out_of_step_pairs([i for i in items if i.b.run_id == run_id])
    recaptured = _recaptured(db, judged, compared)
    candidates = [
        CandidateReport(
            run_id,
            label,
            _checks_left(
                run_id,
                _first_divergence_of(db, session_id, [i for i in items if i.b.run_id == run_id], missing, out_of_step),
                recaptured,
            ),
            against.get(run_id),
            runs.get(against[run_id]) if against.get(run_id) is not None else None,
        )
        for run_id, label, *_ in ordered_runs
        if run_id in compared
    ]
    done = sum(1 for i in everything if i.status != PairStatus.PENDING)
    module_view = None
    stages = StageRanking([], [], 0)
    if modules and items:
        module_view = _module_view(db, judged, candidates[0].run_id if candidates else None)
        if module_view is None:
            stages = stage_culprits(items, _noise_floors(judged, items[0].b.run_id), factor)
    # the runs' problems that are no note nor a file without tensors: files that could not be read, and files read
    # whose tensor's name their run already had (AMBIGUOUS, not unread)
    reasons = db.scalars(
        select(ProblemRecord.reason)
        .join(RunRecord, RunRecord.id == ProblemRecord.run_id)
        .where(RunRecord.session_id == session_id, ProblemRecord.ignored.is_(False))
    ).all()
    ambiguous = sum(1 for reason in reasons if is_second_tensor(reason))
    coverage = coverage_of(
        items,
        missing,
        len(reasons) - ambiguous,
        runs_left_out(ordered_runs),
        _not_asked(db, items, missing),
        _compared_runs(ordered_runs, reference, noise_runs),
        out_of_step,
        ambiguous,
    )
    ingesting = any(r.status not in ("ready", "failed") for r in ordered_runs)
    return SessionPairs(
        pairs=items,
        first_divergence=candidates[0].first_divergence if candidates else None,
        unmatched=unmatched,
        # pairs not one value computed two ways count in no pass or fail figure: not compared
        progress=PairProgress.of(
            len(everything),
            done,
            sum(1 for i in items if i.status == PairStatus.FAIL and i.id not in out_of_step),
            sum(1 for i in everything if i.status == PairStatus.ERROR),
            sum(1 for i in items if i.id in out_of_step and i.status in (PairStatus.PASS, PairStatus.FAIL)),
        ),
        modules=module_view,
        stage_culprits=stages.culprits,
        candidates=candidates,
        worst_pairs=worst_pairs([i for i in items if i.id not in out_of_step]),  # compared pairs only
        stage_ranking=stages.ranked,
        error_growth=error_growth(module_view, stages),
        stage_notes=stages.notes,
        stage_noise_notes=stages.noise_notes,
        coverage=coverage,
        verdict=session_verdict(
            (i.status for i in items if i.id not in out_of_step),
            coverage,
            ingesting,
            diverged=any(c.first_divergence is not None for c in candidates),
            # runs, none a candidate: the reference (a run uploaded alone becomes it) and reruns of it at most
            no_candidate=bool(ordered_runs) and all(r.id == reference or r.id in noise_runs for r in ordered_runs),
        ),
        out_of_step=frozenset(out_of_step),
    )


@dataclass(frozen=True)
class _JudgedPairs:
    """A session's pairs as reports, in execution order (`everything`, the reruns' too), the candidates' pairs
    judged (with a rerun of the reference, by its noise too: `items`), its runs in order, the reruns' ids and the
    noise rule's factor."""

    everything: list[PairReport]
    items: list[PairReport]
    runs: Sequence[Any]
    noise_runs: set[int]
    factor: float


def _judged_pairs(db: DbSession, session_id: int, cache: StatsCache | None) -> _JudgedPairs:
    pairs = read_pairs(db, session_id)
    tensors = read_tensors(db, pairs, session_id)
    result_ids = {p.result_id for p in pairs if p.result_id is not None}
    stats = cache.read(db, result_ids) if cache is not None else read_stats(db, result_ids)
    mismatches = read_rank_mismatches(db, replica_results(pairs))
    dims = db.scalar(select(SessionRecord.dims).where(SessionRecord.id == session_id))
    everything = [
        pair_report(p, tensors, stats.get(p.result_id) if p.result_id else None, mismatches, dims) for p in pairs
    ]
    ordered_runs = db.execute(
        select(RunRecord.id, RunRecord.label, RunRecord.role, RunRecord.status, RunRecord.compared_against_id)
        .where(RunRecord.session_id == session_id)
        .order_by(RunRecord.position)
    ).all()
    noise_runs = {r.id for r in ordered_runs if r.role == "noise"}
    items = [i for i in everything if i.b.run_id not in noise_runs]
    factor = NOISE_FACTOR
    if noise_runs:
        factor = db.scalar(select(SessionRecord.noise_factor).where(SessionRecord.id == session_id)) or NOISE_FACTOR
        items = judge_by_noise(items, [i for i in everything if i.b.run_id in noise_runs], factor)
    return _JudgedPairs(everything, items, ordered_runs, noise_runs, factor)


def _noise_floors(judged: _JudgedPairs, candidate: int | None) -> dict[str, float]:
    """The noise floors that apply to `candidate`'s pairs: none where it is compared against another run than the
    reference (the one the rerun was compared with)."""
    against = {i.a.run_id for i in judged.items if i.b.run_id == candidate}
    return noise_floors([i for i in judged.everything if i.b.run_id in judged.noise_runs and i.a.run_id in against])


def _module_view(db: DbSession, judged: _JudgedPairs, first_candidate: int | None) -> ModuleReport | None:
    """The module view of the first candidate's pairs, on the reference's module tree (`module_report`). Where
    those pairs rest on summaries, its culprits are judged on the session's second capture of both sides with full
    values where it has one (compare/reports/full_values.py), and where it has none, the view says so."""
    view = _candidate_modules(db, judged, first_candidate)
    mine = [i for i in judged.items if i.b.run_id == first_candidate]
    if view is None or first_candidate is None or not rests_on_summaries(mine):
        return view
    labels = {r.id: r.label for r in judged.runs}
    runs = full_values_runs(judged.items, [r.id for r in judged.runs], judged.noise_runs, first_candidate)
    views = [(run, found) for run in runs if (found := _candidate_modules(db, judged, run.candidate)) is not None]
    if not views:
        return replace(view, values_note=summary_words(labels.get(first_candidate, str(first_candidate))))

    def words(run: FullValuesRun) -> str:
        noise = sorted(
            {i.b.run_id for i in judged.everything if i.b.run_id in judged.noise_runs and i.a.run_id == run.against}
        )
        return values_words(labels, run, noise if _noise_floors(judged, run.candidate) else [])

    (run, full), more = views[0], views[1:]
    return with_full_values(view, full, words(run), [(other, words(r).partition(": ")[2]) for r, other in more])


def _recaptured(db: DbSession, judged: _JudgedPairs, candidates: Collection[int]) -> set[int]:
    """Of `candidates`, the runs find_divergence stored its second capture with full values into (its note on them
    says so: `FOUND_BY_FIND_DIVERGENCE`), and those they are a second capture of ("candidate" of "candidate
    (full)"). A second capture the user made (the session's snippet) is not one: nothing checked the models."""
    noted = set(
        db.scalars(
            select(ProblemRecord.run_id).where(
                ProblemRecord.run_id.in_([r.id for r in judged.runs]),
                ProblemRecord.note.is_(True),
                ProblemRecord.reason == FOUND_BY_FIND_DIVERGENCE,
            )
        )
    )
    if not noted:
        return set()
    order = [r.id for r in judged.runs]
    found = noted & set(candidates)
    for run in candidates:
        second = full_values_runs(judged.items, order, judged.noise_runs, run, valued=False)
        if any(s.candidate in noted for s in second):
            found.add(run)
    return found


def _checks_left(candidate: int, found: FirstDivergence | None, recaptured: Collection[int]) -> FirstDivergence | None:
    """`found` (`candidate`'s first divergence) with the checks only find_divergence can make left out where
    find_divergence stored the candidate or its second capture with full values (`recaptured`, `_recaptured`): it
    held the models, checked what needs them, and its answer said what it found: sending the user to run it helps
    nobody."""
    if found is None or not found.find_divergence_checks or candidate not in recaptured:
        return found
    return replace(found, find_divergence_checks=[])


def _candidate_modules(db: DbSession, judged: _JudgedPairs, candidate: int | None) -> ModuleReport | None:
    """`candidate`'s module view, on the module tree of the run its pairs are compared against."""
    mine = [i for i in judged.items if i.b.run_id == candidate]
    if not mine:
        return None
    tree = db.scalar(select(RunRecord.module_tree).where(RunRecord.id == mine[0].a.run_id))
    floors = _noise_floors(judged, candidate)
    ambiguous = frozenset(i.id for i in mine if i.strategy == AMBIGUOUS_STRATEGY)
    return module_report(
        mine, ModuleTree.from_json(tree), floors, judged.factor, frozenset(_out_of_step_pairs(mine)), ambiguous
    )


@dataclass(frozen=True)
class SessionModules:
    """What the model graph shows of a session: the module view of its first candidate (None where no pair comes
    from a module trace or capture) and the id of that candidate's first divergence's pair (None where none)."""

    modules: ModuleReport | None
    first_divergence: int | None


def session_modules(db: DbSession, session_id: int, cache: StatsCache | None = None) -> SessionModules:
    """The module view and the first divergence's pair, as `session_pairs(..., modules=True)` gives them, without
    the rest of its report (unmatched tensors, coverage, the worst pairs, progress, the verdict): the model graph's
    page needs only these, and the rest took a third of its server time for a 2,008-module trace."""
    judged = _judged_pairs(db, session_id, cache)
    items = judged.items
    if not items:
        return SessionModules(None, None)
    compared = {i.b.run_id for i in items}
    first_candidate = next((r.id for r in judged.runs if r.id in compared), None)
    first = next((i for i in items if i.b.run_id == first_candidate and i.status == PairStatus.FAIL), None)
    return SessionModules(_module_view(db, judged, first_candidate), first.id if first is not None else None)


def noise_floors(noise: list[PairReport]) -> dict[str, float]:
    """With a rerun of the reference: the relative RMSE of the reference against it at each reference tensor (by
    name), where compared; what the noise alone makes of that tensor."""
    return {n.a.name: e for n in noise if (e := pair_error(n)) is not None}


def error_growth(modules: ModuleReport | None, stages: StageRanking) -> str | None:
    """ "stands out" where a module or stage is a culprit (or a note says where error stands out without one: a
    block that records no output, a stage whose input was not compared); where some error was added (more than
    engine/culprits.py's MIN_ADDED_ERROR) and none stands out, "even" where at least RANKED_ENOUGH were ranked, "too
    few" where fewer were (no median says what is typical); else None."""
    if modules is not None:
        named = bool(modules.culprits or modules.notes)
        added, count = [c.added_error for c in modules.ranked], len(modules.ranked)
    else:
        named = bool(stages.culprits or stages.notes)
        added, count = [c.added_error for c in stages.ranked], stages.compared
    if named:
        return "stands out"
    if not any(float(parse_number(a)) > MIN_ADDED_ERROR for a in added):
        return None
    return "even" if count >= RANKED_ENOUGH else "too few"


def _compared_runs(runs: Sequence[Any], reference: int | None, noise: set[int]) -> list[tuple[int, str, str]]:
    """The session's candidate runs (of `runs`, in order) that are compared: ready, against a ready run; each as
    (run id, label, label of the run it is compared against)."""
    by_id = {r.id: r for r in runs}
    found = []
    for run in runs:
        against = by_id.get(run.compared_against_id or reference)
        if run.id == reference or run.id in noise or run.status != "ready" or against is None:
            continue
        if against.status == "ready":
            found.append((run.id, run.label, against.label))
    return found


def runs_left_out(runs: Sequence[Any]) -> list[RunNotCompared]:
    """The ready runs (of a session's `runs`, in order) compared against a run that is not ready: it failed, is
    still ingesting, or is gone. Planning pairs them with no other run in its stead, so none of their tensors is
    compared."""
    by_id = {r.id: r for r in runs}
    found = []
    for run in runs:
        if run.status != "ready" or run.role == "noise" or run.compared_against_id is None:
            continue
        against = by_id.get(run.compared_against_id)
        if against is None:
            found.append(RunNotCompared(run.label, None, "was removed"))
        elif against.status != "ready":
            why = "failed" if against.status == "failed" else f"is not ready yet ({against.status})"
            found.append(RunNotCompared(run.label, against.label, why))
    return found


def coverage_of(
    items: list[PairReport],
    missing: list[UnmatchedReport],
    unread_files: int,
    runs_not_compared: Sequence[RunNotCompared] = (),
    not_asked: Collection[tuple[int, str]] = frozenset(),
    candidates: Sequence[tuple[int, str, str]] = (),
    out_of_step: Mapping[int, str] | None = None,
    ambiguous_files: int = 0,
) -> Coverage:
    """What was compared of the reference: `items` the candidates' pairs, `missing` the reference's tensors with no
    partner in a candidate (each once per candidate); `runs_not_compared` as `runs_left_out` finds them;
    `not_asked`: (candidate run id, tensor name) of `missing` that candidate was not asked to record (`_not_asked`);
    `candidates`: each candidate's (run id, label, label of the run it is compared against), in order, for `runs`;
    `out_of_step`: the pairs of ops out of step (by id, with why: `_out_of_step_pairs`), not compared;
    `unread_files`, `ambiguous_files`: the runs' files that could not be read, and those whose tensor's name their
    run already had."""
    passed_over = out_of_step or {}
    # `missing` comes in each run's execution order; those after the last pair (no position) come last
    in_order = sorted(missing, key=lambda u: u.before_position if u.before_position is not None else math.inf)
    asked = [u for u in in_order if (u.against_run_id, u.name) not in not_asked]
    not_allowed = list(dict.fromkeys(u.name for u in asked if not u.allowed))
    allowed = [n for n in dict.fromkeys(u.name for u in asked if u.allowed) if n not in set(not_allowed)]
    judged: dict[str, bool] = {}
    for i in items:
        if i.strategy == PairingStrategy.EXPLORE:  # one run, every tensor against every other: each of either side,
            for name in (i.a.name, i.b.name):  # compared where any pair of it was (others may not fit its shape)
                judged[name] = judged.get(name, False) or _compared(i, passed_over)
        else:
            judged[i.a.name] = judged.get(i.a.name, True) and _compared(i, passed_over)
    left_out = set(not_allowed) | set(allowed)
    # a tensor no candidate that compared anything of it was asked to record: left out by choice, never compared
    unasked = [
        n for n in dict.fromkeys(u.name for u in in_order if (u.against_run_id, u.name) in not_asked) if n not in judged
    ]
    allowed += [n for n in unasked if n not in left_out]
    return Coverage(
        reference_tensors=len(set(judged) | left_out | set(unasked)),
        compared=sum(1 for name, ok in judged.items() if ok and name not in left_out),
        unmatched=not_allowed,
        allowed_unmatched=allowed,
        not_compared=[i.name for i in items if i.status in (PairStatus.INCOMPARABLE, PairStatus.ERROR)],
        unread_files=unread_files,
        ambiguous_files=ambiguous_files,
        runs_not_compared=list(runs_not_compared),
        runs=[_run_coverage(c, items, missing, not_asked, passed_over) for c in candidates],
        out_of_step=[OutOfStep(i.name, why) for i in items if (why := passed_over.get(i.id)) is not None],
    )


def _compared(pair: PairReport, out_of_step: Mapping[int, str]) -> bool:
    """Whether a pair's values were compared: a pass or a fail, of ops in step."""
    return pair.status in (PairStatus.PASS, PairStatus.FAIL) and pair.id not in out_of_step


def _run_coverage(
    candidate: tuple[int, str, str],
    items: list[PairReport],
    missing: list[UnmatchedReport],
    not_asked: Collection[tuple[int, str]],
    out_of_step: Mapping[int, str],
) -> RunCoverage:
    """One candidate's coverage of the run it is compared against (`coverage_of`'s arguments)."""
    run_id, label, against = candidate
    judged: dict[str, bool] = {}
    for i in items:
        if i.b.run_id == run_id:
            judged[i.a.name] = judged.get(i.a.name, True) and _compared(i, out_of_step)
    mine = {u.name for u in missing if u.against_run_id == run_id}
    unasked = {name for name in mine if (run_id, name) in not_asked}
    return RunCoverage(
        label,
        against,
        len(set(judged) | (mine - unasked)),
        sum(1 for name, ok in judged.items() if ok and name not in mine),
        len(unasked),
    )


def _not_asked(db: DbSession, items: list[PairReport], missing: list[UnmatchedReport]) -> set[tuple[int, str]]:
    """(candidate run id, tensor name) of the `missing` tensors (allowed to stay unpaired) that the candidate was not
    asked to record: outside the scope of its capture (compare/planning/plan.py's `_unasked`, decided again here
    from the run's module tree, the tensors' module paths and positions)."""
    allowed = [u for u in missing if u.allowed and u.tensor_ids]
    scopes = {}
    for run_id in {u.against_run_id for u in allowed}:
        scope = capture_scope(db, run_id)
        if scope is not None:
            scopes[run_id] = scope
    if not scopes:
        return set()
    last: dict[int, int] = {}  # each scoped candidate's last tensor asked for: its partner's first tensor id
    for i in items:
        scope = scopes.get(i.b.run_id)
        if scope is not None and scope.last is not None and i.b.name == scope.last and i.a.tensor_ids:
            last.setdefault(i.b.run_id, i.a.tensor_ids[0])
    ids = {u.tensor_ids[0] for u in allowed if u.against_run_id in scopes} | set(last.values())
    places = {
        t.id: (t.module_path, t.position)
        for t in db.execute(
            select(TensorRecord.id, TensorRecord.module_path, TensorRecord.position).where(TensorRecord.id.in_(ids))
        )
    }
    outside = {
        run_id: outside_scope(scope, places[last[run_id]][1] if run_id in last and last[run_id] in places else None)
        for run_id, scope in scopes.items()
    }
    found = set()
    for u in allowed:
        place = places.get(u.tensor_ids[0])
        if u.against_run_id in outside and place is not None and outside[u.against_run_id](*place):
            found.add((u.against_run_id, u.name))
    return found


def with_closest(
    db: DbSession, unmatched: list[UnmatchedReport], missing: list[UnmatchedReport]
) -> list[UnmatchedReport]:
    """`unmatched` with each of `missing` (reference tensors without partner) given its closest candidates among
    its candidate run's own unpaired tensors."""
    targets = {id(u) for u in missing}
    ids = {i for u in unmatched for i in u.tensor_ids}
    shapes = (
        {
            t.id: (tuple(t.shape), t.layer)
            for t in db.execute(
                select(TensorRecord.id, TensorRecord.shape, TensorRecord.layer).where(TensorRecord.id.in_(ids))
            )
        }
        if ids
        else {}
    )

    def unpaired(u: UnmatchedReport) -> Unpaired:
        found = [shapes[i] for i in u.tensor_ids if i in shapes]
        return Unpaired(u.name, found[0][1] if found else None, [s for s, _ in found])

    out = {}
    for run_id in {u.against_run_id for u in missing}:
        mine = [u for u in missing if u.against_run_id == run_id]
        theirs = [unpaired(u) for u in unmatched if u.run_id == run_id and id(u) not in targets]
        for u, best in zip(mine, closest_candidates([unpaired(u) for u in mine], theirs), strict=True):
            out[id(u)] = replace(u, closest=best)
    return [out.get(id(u), u) for u in unmatched]


def judge_by_noise(items: list[PairReport], noise: list[PairReport], factor: float) -> list[PairReport]:
    """Each candidate pair with its noise floor (the reference tensor's pair with the rerun) and the verdict of the
    noise rule where it applies (`noise.py`). Only a pair whose a side is the run the rerun is compared against
    (the reference, or the run it names: find_divergence's "noise (full)" against "reference (full)") has a
    floor: the rerun measures that run's noise, not that of another."""
    floors = {(n.a.run_id, n.a.name): n for n in noise}
    judged = []
    for item in items:
        floor = floors.get((item.a.run_id, item.a.name))
        on_summaries = _judged_on_summaries(item, floor, factor)
        if on_summaries is not None:
            judged.append(on_summaries)
            continue
        floor_error = floor.stats.max_abs_diff if floor is not None and floor.stats is not None else None
        verdict = noise_judges(item.stats.max_abs_diff if item.stats else None, floor_error, factor)
        # a verdict to judge again: a pass or a fail, or a pair incomparable only for the reference rows its
        # alignment cut away (what was compared of it may be beyond the noise)
        judged_again = item.status in (PairStatus.PASS, PairStatus.FAIL) or (
            item.status == PairStatus.INCOMPARABLE and item.reference_cut is not None and item.stats is not None
        )
        if floor is not None and floor.status == PairStatus.PENDING and judged_again:
            judged.append(replace(item, status=PairStatus.PENDING))  # its verdict waits for its floor
        elif verdict is None or not judged_again:
            judged.append(replace(item, noise_max_abs_diff=floor_error))
        else:
            # within the noise is no pass either where reference rows were cut away (cut_verdict)
            settled, error = cut_verdict(verdict, item.reference_cut, "noise")
            status = PairStatus(settled)
            where = item.where if status == PairStatus.FAIL else None  # known where tolerances failed it too
            judged.append(
                replace(
                    item,
                    status=status,
                    error=error if status == PairStatus.INCOMPARABLE else item.error,
                    rule=str(Rule.NOISE),
                    noise_max_abs_diff=floor_error,
                    where=where,
                )
            )
    return judged


def _judged_on_summaries(item: PairReport, floor: PairReport | None, factor: float) -> PairReport | None:
    """A pair known by its summaries judged by the noise rule against its floor's summaries (`noise.py`'s
    `summary_noise_verdict`: its words say it rests on summaries); None where that rule does not apply."""
    if floor is None or item.summary is None or item.status not in (PairStatus.PASS, PairStatus.FAIL):
        return None
    verdict = summary_noise_verdict(item.summary, floor.summary, math.prod(item.a.shape), factor)
    if verdict is None or floor.summary is None or isinstance(floor.summary.sampled_max_abs_diff, UnsetType):
        return None
    settled, error = cut_verdict(verdict.passed, item.reference_cut, "noise on summaries")
    return replace(
        item,
        status=PairStatus(settled),
        error=error if settled == PairStatus.INCOMPARABLE else item.error,
        summary=verdict,
        rule=str(Rule.NOISE),
        noise_max_abs_diff=floor.summary.sampled_max_abs_diff,  # from summaries: the floor's sampled max |diff|
    )


def apply_order(pairs: list[PairReport], order: list[str] | None) -> list[PairReport]:
    """The user's own order (by pair key "a_name|b_name"), pairs it does not name after, in execution order."""
    if not order:
        return pairs
    rank = {key: i for i, key in enumerate(order)}
    return sorted(pairs, key=lambda p: (rank.get(p.key, len(rank)), p.position))


def _first_divergence_of(
    db: DbSession,
    session_id: int,
    mine: list[PairReport],
    missing: Sequence[UnmatchedReport],
    out_of_step: Collection[int],
) -> FirstDivergence | None:
    """The first divergence among one candidate's pairs `mine` (in execution order), with the candidate's tensors
    without partner just before it. The pairs of ops out of step (`out_of_step`, their ids: `_out_of_step_pairs`)
    are no divergence: they are passed over."""

    def passed_over(pair: PairReport) -> bool:
        return pair.id in out_of_step

    # a module's output of another shape, the module called as often on each side (a stride changed): it diverges
    reshaped = reshaped_pairs(db, session_id, mine)

    def diverges(pair: PairReport) -> bool:
        return (pair.status == PairStatus.FAIL or pair.id in reshaped) and not passed_over(pair)

    at = next((k for k, i in enumerate(mine) if diverges(i)), None)
    if at is None:
        return None
    found = first_divergence(mine[at], missing)
    if found is None:
        return None
    failing = [p for p in mine if diverges(p)]
    tied = mine[at].module_path is None and any(
        p is not mine[at] and p.module_path is None and (p.layer, p.stage) == (mine[at].layer, mine[at].stage)
        for p in failing
    )  # two dumps' tensors of one layer and stage (two folders, two archives): which ran first is not known
    if tied or not all(_in_execution_order(p) for p in failing):
        # a failing pair whose place in execution is not known may have failed earlier: no "first", no "before"
        return replace(found, in_execution_order=False, unmatched_before=[])
    unordered = _unordered_layer(mine[at], failing)
    if unordered is not None:
        # failing stages of one layer whose order is not known (`q_proj`, `mlp`): sorted by name, not by execution
        return replace(found, in_execution_order=False, unmatched_before=[], order_note=unordered)
    # from the last pair in step before it: an out-of-step pair's candidate op may come after the divergence; a
    # pair holding no elements (a cache's `torch.tensor([])` just before its first `cat`) agrees by holding nothing,
    # so the candidate's ops before it are still just before the divergence
    previous = next((p for p in reversed(mine[:at]) if not passed_over(p) and not _holds_nothing(p)), None)
    # a reference op without partner before it, in the same module call, pairs after it (an op the port runs once
    # more beside its twin, a scale applied twice: neither of the port's faces the reference's, and the mask's ops
    # pair between them and the divergence): the candidate's own from the pair before the last such op, where the
    # port's extra call is
    call = (mine[at].module_path or "").partition("/")
    last_unmatched = max(
        (
            u.before_position
            for u in missing
            if u.name in found.unmatched_before
            and u.against_run_id == mine[at].b.run_id
            and u.before_position is not None
            and call[1]
            and u.name.startswith(call[0] + "/")
        ),
        default=None,
    )
    if previous is not None and last_unmatched is not None and last_unmatched <= previous.position:
        previous = next(
            (
                p
                for p in reversed(mine[:at])
                if p.position < last_unmatched and not passed_over(p) and not _holds_nothing(p)
            ),
            None,
        )
    extra = candidate_only_before(db, session_id, mine[at], previous)
    if not extra and not found.unmatched_before and call[1]:
        # none just before it: the candidate's own earlier in the op's module call, pairs that agree between them
        # and it (Falcon's slopes negated, then the positions' ops, then the slopes' use), as find_divergence names
        outside = next((p for p in reversed(mine[:at]) if not (p.module_path or "").startswith(call[0] + "/")), None)
        extra = candidate_only_before(db, session_id, mine[at], outside)
    changed = next((p for p in mine[:at] if _changed(p) and _known_before(p, mine[at])), None)
    where = f" ({changed.a.source})" if changed is not None and changed.a.source else ""
    # pairs that differ too whose order against it is not known (two stages of a dump's layer, one not in the stage
    # order): it is not known to be the first, so they are named beside it
    beside = [
        p.name
        for p in mine[:at]
        if changed is not None and p is not changed and _changed(p) and not _known_before(changed, p)
    ]
    if beside:
        where += f" or {', '.join(beside)} (their order is not known)"
    lowered = lowered_first(db, mine[at], mine)
    return replace(
        found,
        candidate_only_before=extra,
        first_changed=f"{changed.name}{where}" if changed is not None else None,
        first_changed_on_summaries=changed is not None and summary_basis(changed.summary),
        crossed_before=crossed_before(mine, at),
        lowered_first=lowered,
        shapes=[list(mine[at].a.shape), list(mine[at].b.shape)] if mine[at].id in reshaped else None,
        candidate_early_before=recorded_early(db, mine, at, out_of_step),
        candidate_holds=held_before_of(db, mine[at]),
        find_divergence_checks=model_checks(mine[at], changed.name if changed is not None else None, lowered),
        outputs_agree=outputs_agree(db, mine, [u.name for u in missing if u.against_run_id == mine[at].b.run_id]),
        not_compared_before=[
            f"{p.name} ({_not_compared_why(p)})"
            for p in mine[:at]
            if p.status in _NOT_COMPARED and not passed_over(p) and _known_before(p, mine[at])
        ],
    )


# a pair of these statuses holds no verdict on its values: a divergence before it may have begun there
_NOT_COMPARED = (PairStatus.INCOMPARABLE, PairStatus.ERROR, PairStatus.PENDING)


def _not_compared_why(pair: PairReport) -> str:
    """Why a pair before a first divergence holds no verdict, in a few words."""
    if pair.status == PairStatus.PENDING:
        return "not compared yet"
    if pair.status == PairStatus.ERROR:
        return "comparing it failed"
    if pair.a.shape != pair.b.shape:
        return f"incomparable: {list(pair.a.shape)} vs {list(pair.b.shape)}"
    return "incomparable"


def _in_execution_order(pair: PairReport) -> bool:
    """Whether the pair's place in execution order is known: a traced or captured tensor (its call order), or a
    dump's stage (`{layer}_{stage}` names, the session's name pattern). A state dict's or a checkpoint's keys, and
    names without a stage, are in the order of their names, not of execution."""
    return pair.module_path is not None or pair.stage is not None


def _known_before(pair: PairReport, item: PairReport) -> bool:
    """Whether `pair`, listed before `item`, is known to have run before it: not two stages of one layer of a dump
    whose order is not known (`0_hidden` listed after `0_query` by name)."""
    if pair.module_path is not None or item.module_path is not None or pair.layer != item.layer:
        return True
    return stages_ordered([pair.stage, item.stage])


def _unordered_layer(item: PairReport, failing: list[PairReport]) -> str | None:
    """Where `item` is a dump's tensor and the failing pairs of its layer have stages whose execution order is not
    known (`engine/stages.stages_ordered`), why in words; else None."""
    if item.module_path is not None:
        return None
    stages = [p.stage for p in failing if p.module_path is None and p.layer == item.layer]
    return None if stages_ordered(stages) else unordered_words(item.layer, stages)


def _out_of_step_pairs(mine: list[PairReport]) -> dict[int, str]:
    """Of one candidate's pairs `mine`, those not one value computed two ways, by id, each with why in plain words:
    not compared. Two captured ops paired (by hand, or by a strategy other than the alignment of their module
    call's ops, `engine/op_alignment.pair_ops`, which pairs only ops of one shape and dtype's kind) whose shapes or
    dtypes' kinds differ; a module's inputs of different kinds (`op_alignment.out_of_step`)."""
    found = {}
    for pair in mine:
        if pair.module_path is None:  # a dump's tensors are no captured ops
            continue
        if out_of_step(pair.name, (pair.a.shape, pair.b.shape), (pair.a.dtype, pair.b.dtype)):
            call = op_call(pair.a.name)
            if call is not None:
                found[pair.id] = (
                    f"ops out of step: the two sides' {call[1]} calls in {call[0] or 'the model'} do not line up "
                    f"({pair.a.dtype} {pair.a.shape} against {pair.b.dtype} {pair.b.shape})"
                )
            else:
                found[pair.id] = f"inputs of different kinds: {pair.a.dtype} against {pair.b.dtype}"
    return found


def _changed(pair: PairReport) -> bool:
    """Whether a passing pair's values differ at all: a max |diff| above 0, or summaries whose hashes (of one kind)
    differ."""
    if pair.status != PairStatus.PASS:
        return False
    if pair.stats is not None and pair.stats.max_abs_diff is not None:
        return bool(pair.stats.max_abs_diff != 0)
    return pair.summary is not None and pair.summary.on_summary and pair.summary.hashes_differ is True


def first_divergence(item: PairReport | None, missing: Sequence[UnmatchedReport] = ()) -> FirstDivergence | None:
    """The divergence at `item`, with the reference tensors of `missing` (without partner) before it in execution
    order that the user did not allow."""
    if item is None:
        return None
    before = sorted(
        (
            u
            for u in missing
            if u.against_run_id == item.b.run_id
            and not u.allowed
            and u.before_position is not None
            and u.before_position <= item.position
        ),
        key=lambda u: (u.before_position, u.name),
    )
    return FirstDivergence(
        item.id,
        item.name,
        item.layer,
        item.stage,
        item.stats.max_abs_diff if item.stats else None,
        item.stats.argmax if item.stats else None,
        item.where,
        item.a.source,
        item.b.source,
        list(dict.fromkeys(u.name for u in before)),
        "summary" if summary_basis(item.summary) else None,
        str(item.summary.reason) if item.summary is not None and summary_basis(item.summary) else None,
        item.module_path,
        source_note=input_source_note(item),
        place=item.place,
        paired_by=guessed_by(item.strategy),
        candidate_name=item.b.name if guessed_by(item.strategy) else None,
    )


def input_source_note(item: PairReport) -> str | None:
    """Why a pair of a module's inputs has no source line on a side, in words; None where both sides have one (a
    capture's: the line that called the module), or it is no module's input (an op's line is its caller's; a
    module's output has the lines of its ops)."""
    if not (item.place or "").startswith("inputs") or (item.a.source and item.b.source):
        return None
    sides = " and ".join(w for w, s in (("the reference", item.a.source), ("the candidate", item.b.source)) if not s)
    return (
        f"no source line: {sides} did not record which line of code passed this input (a capture records the "
        "line that called the module, where that line is outside torch; a trace or dump read from files records none)"
    )


def summary_basis(summary: SummaryReport | None) -> bool:
    """Whether a pair's verdict rests on summaries (`summary_compare.SketchVerdict`)."""
    return summary is not None and summary.on_summary


def pair_detail(db: DbSession, context: CompareContext, pair_id: int) -> PairDetail:
    pair = db.get(PairRecord, pair_id)
    if pair is None:
        raise NotFoundError(f"no pair with id {pair_id}")
    tensors = read_tensors(db, [pair])
    result = db.get(ComparisonResultRecord, pair.result_id) if pair.result_id else None
    mismatches: dict[int, list[int]] = {}
    if result is not None and replica_results([pair]):  # its ranks, read now where no comparison kept them
        mismatches[result.id] = error_profile(db, context, pair.id, 0).mismatched
    fields = _pair_fields(pair, tensors, mismatches)
    session = db.get_one(SessionRecord, pair.session_id)
    spans = result.stats.get("where") if result is not None else None
    return PairDetail(
        **fields,
        where=_where(fields, None if spans is None else [ErrorSpan.from_json(s) for s in spans], session.dims),
        stats=PairStatsFull.from_json(result.stats) if result is not None else None,
        alignment_steps=stored_steps(pair.alignment),
        shapes=PairShapes([tensors[i].shape for i in pair.a_tensor_ids], [tensors[i].shape for i in pair.b_tensor_ids]),
        argmax=argmax_report(db, context, pair, result, tensors),
    )


def argmax_report(
    db: DbSession, context: CompareContext, pair: PairRecord, result: Any | None, tensors: dict[int, Any]
) -> ArgmaxReport | None:
    """Where the largest difference is: in aligned coordinates, and in each run's own tensor (shard and index)."""
    if result is None or pair.alignment is None:
        return None
    stats = PairStats.from_json(result.stats)
    if stats.argmax is None:
        return None
    view_a, view_b, _ = views(context.store, db, pair)
    sides = []
    for view, ids in ((view_a, pair.a_tensor_ids), (view_b, pair.b_tensor_ids)):
        shard, index = view.locate(stats.argmax)
        tensor = tensors[ids[shard]]
        sides.append(ArgmaxSide(tensor.name, tensor.id, list(index)))
    return ArgmaxReport(list(stats.argmax), json_number(stats.max_abs_diff), sides[0], sides[1])


def _holds_nothing(pair: PairReport) -> bool:
    """Whether both sides of `pair` hold no elements (a dimension of size 0)."""
    return 0 in pair.a.shape and 0 in pair.b.shape
